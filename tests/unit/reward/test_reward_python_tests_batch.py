"""python_tests in batch mode: several answers to one task in one sandbox score exactly as each
would alone, a job cannot reach the next one, and what the batch cannot vouch for is rescored alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from test_reward_python_tests import CORRECT, make_task

from tidal.config.schema import RewardConfig, SandboxConfig
from tidal.reward import Scorer, ScoringContext, get_verifier
from tidal.reward.registry import get_batch_verifier
from tidal.reward.verifiers.python_tests import python_tests_batch
from tidal.sandbox import get_backend
from tidal.sandbox.base import SandboxBackend
from tidal.types import Outcome, Score, Task

WRONG = "def sum_evens(xs):\n    return -1\n"
DAEMON = (  # leaves a detached grandchild that, if it lived on, would rewrite every workspace it finds
    "import glob, os, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        home = os.getcwd()\n"
    "        end = time.monotonic() + {seconds}\n"
    "        while time.monotonic() < end:\n"
    "            for path in glob.glob('/workspace/*/*.py') + glob.glob('/workspace/*.py'):\n"
    "                if not path.startswith(home + '/'):\n"
    "                    try:\n"
    "                        body = 'def test_ok():\\n    pass\\n' if 'test_' in path else 'def sum_evens(xs):\\n    return 0\\n'\n"
    "                        open(path, 'w').write(body)\n"
    "                    except OSError:\n"
    "                        pass\n"
    "            time.sleep({pause})\n"
    "        os._exit(0)\n"
    "    os._exit(0)\n"
    "time.sleep(0.2)\n"
)
ANSWERS = {
    "correct": CORRECT,
    "wrong": WRONG,
    "partly right": "def sum_evens(xs):\n    return sum(x for x in xs if x % 2 == 0 and x > 0)\n",
    "syntax error": "def sum_evens(xs) return 0\n",
    "exit at import": "import os\nos._exit(0)\n",
    "infinite loop": "def sum_evens(xs):\n    while True:\n        pass\n",
    "test-file tamperer": "open('test_solution.py', 'w').write('def test_ok():\\n    pass\\n')\n" + WRONG,
    "conftest dropper": "open('conftest.py', 'w').write('import pytest\\n')\n" + CORRECT,
    "background daemon": DAEMON.format(seconds=30, pause=0.05) + WRONG,
    "memory bomb": "blob = bytearray(8 * 1024 ** 3)\n" + CORRECT,
    "fork bomb": (
        "import os, time\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "except OSError:\n"
        "    pass\n" + CORRECT
    ),
}


class Counting:
    """A backend that counts how it is used."""

    def __init__(self, backend: SandboxBackend) -> None:
        self.backend, self.name, self.python = backend, backend.name, backend.python
        self.runs = 0
        self.batches: list[int] = []

    def run(self, *args: Any, **kwargs: Any) -> Any:
        self.runs += 1
        return self.backend.run(*args, **kwargs)

    def run_batch(self, jobs: Any, **kwargs: Any) -> Any:
        self.batches.append(len(jobs))
        return self.backend.run_batch(jobs, **kwargs)  # type: ignore[attr-defined]


def outcomes(scores: list[Score]) -> list[tuple[float, Outcome]]:
    return [(round(score.value, 6), score.outcome) for score in scores]


@pytest.fixture
def counting(sandboxed: ScoringContext) -> tuple[Counting, ScoringContext]:
    backend = Counting(sandboxed.sandbox())
    return backend, ScoringContext(backend)  # type: ignore[arg-type]


def test_batched_scores_equal_single_scores(counting: tuple[Counting, ScoringContext]) -> None:
    backend, ctx = counting
    task = make_task(limits={"timeout_s": 4})
    answers = list(ANSWERS.values())
    batched = python_tests_batch(task, answers, ctx)
    assert backend.batches == [len(answers)] and backend.runs == 0  # one sandbox, nothing rescored
    with ThreadPoolExecutor(max_workers=2) as pool:  # two sandboxes at a time, as a scorer runs them
        single = list(pool.map(lambda answer: get_verifier("python_tests")(task, answer, ctx), answers))
    for name, one, alone in zip(ANSWERS, batched, single):
        assert (round(one.value, 6), one.outcome) == (round(alone.value, 6), alone.outcome), (name, one.detail, alone.detail)
    # Exits at import and processes left running are tamper signals (docs/design/sandbox.md).
    expected = {"correct": Outcome.PASSED, "wrong": Outcome.FAILED, "syntax error": Outcome.FAILED,
                "exit at import": Outcome.TAMPERED, "infinite loop": Outcome.TIMEOUT,
                "test-file tamperer": Outcome.TAMPERED, "conftest dropper": Outcome.TAMPERED,
                "background daemon": Outcome.TAMPERED, "memory bomb": Outcome.MEMORY_LIMIT, "fork bomb": Outcome.TAMPERED}
    assert {name: score.outcome for name, score in zip(ANSWERS, batched) if name in expected} == expected


def test_a_daemon_cannot_reach_the_next_answer(counting: tuple[Counting, ScoringContext]) -> None:
    backend, ctx = counting
    task = make_task()
    attacker = DAEMON.format(seconds=20, pause=0.01) + "time.sleep(0.5)\n" + WRONG
    scores = python_tests_batch(task, [attacker, CORRECT, CORRECT + "\n# again\n"], ctx)
    assert backend.batches == [3] and backend.runs == 0
    assert outcomes(scores) == [(0.0, Outcome.TAMPERED), (1.0, Outcome.PASSED), (1.0, Outcome.PASSED)], scores


@pytest.mark.parametrize("killer", ["os.kill(os.getppid(), signal.SIGKILL)", "os.kill(-1, signal.SIGKILL)"])
def test_answers_after_one_that_kills_the_zygote_are_scored_alone(
    counting: tuple[Counting, ScoringContext], killer: str
) -> None:
    backend, ctx = counting
    task = make_task(mode="in_process")  # out of process, the answer's parent is its pytest process, not the zygote
    attacker = f"import os, signal\ntry:\n    {killer}\nexcept OSError:\n    pass\n" + CORRECT
    partly = ANSWERS["partly right"]
    scores = python_tests_batch(task, [WRONG, attacker, CORRECT, partly], ctx)
    assert backend.batches == [4] and backend.runs == 3  # the attacker and the two after it, alone
    single = [get_verifier("python_tests")(task, answer, ctx) for answer in (WRONG, attacker, CORRECT, partly)]
    assert outcomes(scores) == outcomes(single)
    assert outcomes(scores) == [(0.0, Outcome.FAILED), (0.0, Outcome.TAMPERED), (1.0, Outcome.PASSED),
                                (0.75, Outcome.FAILED)]  # the attacker's kill at import is a tamper signal


def test_a_backend_without_batches_scores_each_alone() -> None:
    task = make_task()
    assert get_batch_verifier("python_tests").__wrapped__ is python_tests_batch  # type: ignore[union-attr]
    scores = python_tests_batch(task, [CORRECT, WRONG], ScoringContext(get_backend("unsafe_local")))
    assert outcomes(scores) == [(1.0, Outcome.PASSED), (0.0, Outcome.FAILED)]


def test_the_scorer_batches_by_task_and_scores_each_distinct_answer_once(
    counting: tuple[Counting, ScoringContext],
) -> None:
    backend, _ = counting
    other = Task(id="code/double", domain="code", prompt="double(x)", verifier={"name": "python_tests"},
                 tests={"test_solution.py": "from solution import double\ndef test_a():\n    assert double(2) == 4\n"})
    double = "def double(x):\n    return 2 * x\n"
    items: list[tuple[Task, str | bytes]] = [
        (make_task(), CORRECT), (other, double), (make_task(), WRONG), (make_task(), CORRECT.encode()),
        (other, "def double(x):\n    return x\n"), (other, double), (make_task(), b"\xff"),
    ]
    scorer = Scorer(RewardConfig(sandbox=SandboxConfig(workers=2)), backend=backend)  # type: ignore[arg-type]
    scores = scorer.score_many(items)
    assert sorted(backend.batches) == [2, 2] and backend.runs == 0
    assert [s.outcome for s in scores] == [Outcome.PASSED, Outcome.PASSED, Outcome.FAILED, Outcome.PASSED,
                                           Outcome.FAILED, Outcome.PASSED, Outcome.FAILED]
    assert scores[0] is not scores[3]  # copies: a caller changing one does not change the others
    assert outcomes(scorer.score_many(items)) == outcomes(scores)
    assert sorted(backend.batches) == [2, 2] and backend.runs == 0  # all from the cache


def test_a_lone_distinct_answer_is_batched_not_run_cold(counting: tuple[Counting, ScoringContext]) -> None:
    # A sharp policy's group is often one answer eight times: that one answer goes to the batch
    # form (a fork of a warm zygote under a pool) rather than a cold sandbox of its own.
    backend, _ = counting
    scorer = Scorer(RewardConfig(sandbox=SandboxConfig(workers=2)), backend=backend)  # type: ignore[arg-type]
    other = make_task().model_copy(update={"id": "code/other"})
    scores = scorer.score_many([(make_task(), CORRECT)] * 8 + [(other, WRONG)])
    assert sorted(backend.batches) == [1, 1] and backend.runs == 0
    assert [s.outcome for s in scores] == [Outcome.PASSED] * 8 + [Outcome.FAILED]
    single = get_verifier("python_tests")(make_task(), CORRECT, ScoringContext(backend))  # type: ignore[arg-type]
    assert (single.value, single.outcome) == (scores[0].value, scores[0].outcome) and backend.runs == 1
