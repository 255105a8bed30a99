"""The acceptance tests run in the episode's own session, after the agent's last command: they see
exactly what the agent left, what the agent planted on the tests' paths is replaced, and nothing
the agent left can run before the report plugin or write the verdict."""

from __future__ import annotations

import pytest

from tidal.agent import AgentOutcome, ScriptedPolicy, format_tool_call, run_episode
from tidal.agent.acceptance import run_acceptance
from tidal.sandbox.base import SandboxBackend
from tidal.sandbox.session import SandboxSession, open_session
from tidal.types import Outcome, Task

OUT_TEST = "def test_out():\n    assert open('out.txt').read() == 'hello\\n'\n"


def _task(tests: dict[str, str]) -> Task:
    return Task(id="agent/accept", domain="agent", prompt="Write hello into out.txt",
                verifier={"name": "python_tests"}, tests=tests, max_steps=3)


def _agent(backend: SandboxBackend, script: str) -> SandboxSession:
    """A session after an agent whose only step was `bash -c script` (what the bash tool runs)."""
    session = open_session(backend, {})
    result = session.exec(["bash", "-c", script])
    assert result.exit_code == 0, result.stderr_text
    return session


def test_the_tests_see_links_modes_and_empty_folders_the_agent_left(bwrap: SandboxBackend) -> None:
    # A copy of the workspace would drop all three; the session keeps them.
    test = ("import os\n"
            "def test_left():\n"
            "    assert os.path.islink('link') and os.readlink('link') == 'out.txt'\n"
            "    assert open('link').read() == 'hello\\n'\n"
            "    assert os.access('run.sh', os.X_OK) and os.path.isdir('empty')\n")
    work = "echo hello > out.txt; ln -s out.txt link; printf 'echo hi\\n' > run.sh; chmod 755 run.sh; mkdir empty"
    policy = ScriptedPolicy([format_tool_call("bash", {"command": work}), format_tool_call("submit", {})])
    result = run_episode(_task({"test_left.py": test}), policy, bwrap)
    assert result.outcome is AgentOutcome.PASS, result.detail


def test_what_the_agent_planted_on_the_tests_paths_is_replaced(bwrap: SandboxBackend) -> None:
    more = "def test_more():\n    assert open('out.txt').read() == 'hello\\n'\n"
    task = _task({"test_out.py": OUT_TEST, "tests/test_more.py": more})
    plant = ("printf 'def test_out():\\n    pass\\n' > test_out.py; "  # a test that always passes
             "mkdir decoy; printf 'def test_more():\\n    pass\\n' > decoy/test_more.py; ln -s decoy tests; "
             "mkdir __pycache__; echo junk > __pycache__/test_out.cpython-311-pytest-9.2.0.pyc")
    with _agent(bwrap, plant) as session:
        score = run_acceptance(task, session, bwrap)
        assert score.outcome is Outcome.FAILED and score.info["total"] == 2 and score.info["passed"] == 0, score.detail
        assert session.read_file("test_out.py").decode() == OUT_TEST
        # The link was removed, not followed: the decoy keeps the agent's file.
        assert session.read_file("decoy/test_more.py").decode() == "def test_more():\n    pass\n"
        assert session.read_file("tests/test_more.py").decode() == more
        with pytest.raises(FileNotFoundError):
            session.read_file("__pycache__/test_out.cpython-311-pytest-9.2.0.pyc")


def test_the_agent_cannot_run_code_before_the_report_plugin(bwrap: SandboxBackend) -> None:
    # `python -m pytest` would import a workspace pytest.py (or argparse.py) first; here it may not,
    # so a planted one neither forges a verdict nor turns the failure into an infra error.
    planted = "printf 'import sys\\nprint(\"forged\")\\nsys.exit(0)\\n' | tee pytest.py argparse.py > /dev/null"
    with _agent(bwrap, planted) as session:
        score = run_acceptance(_task({"test_out.py": OUT_TEST}), session, bwrap)
    assert score.outcome is Outcome.FAILED, score.detail
    # The agent's modules are still importable by the tests, wherever the tests live.
    task = _task({"tests/test_import.py": "from solution import f\ndef test_f():\n    assert f() == 3\n"})
    with _agent(bwrap, "printf 'def f():\\n    return 3\\n' > solution.py") as session:
        assert run_acceptance(task, session, bwrap).outcome is Outcome.PASSED


def test_tests_changed_during_the_run_are_tampering(bwrap: SandboxBackend) -> None:
    test = "import helper\ndef test_out():\n    assert helper.DONE\n"
    rewrite = "open('test_out.py', 'w').write('def test_out():\\n    pass\\n')\nDONE = False\n"
    with _agent(bwrap, f"cat > helper.py <<'EOF'\n{rewrite}EOF") as session:
        score = run_acceptance(_task({"test_out.py": test}), session, bwrap)
    assert score.outcome is Outcome.TAMPERED, score.detail


def test_a_workspace_the_agent_made_unreadable_is_still_judged(bwrap: SandboxBackend) -> None:
    # Not an infra error the agent could hide a failure behind: the tests get owner access back.
    with _agent(bwrap, "echo hello > out.txt; chmod 000 out.txt; chmod 000 .") as session:
        score = run_acceptance(_task({"test_out.py": OUT_TEST}), session, bwrap)
    assert score.outcome is Outcome.PASSED, score.detail
