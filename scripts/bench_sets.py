"""Write the benchmark-style held-out sets configs/data/bench_code.jsonl and bench_math.jsonl.

    .venv/bin/python scripts/bench_sets.py

The problems are hand-written in bench_code_problems.py and bench_math_problems.py, apart from
tidal's generators (issue 44): code in the common code-benchmark layout (`task_id, prompt,
canonical_solution, test, entry_point`, read by `tidal tasks import --format code-tests`), math in
GSM8K's (`question, answer` with a worked solution ending `#### N`, read by `--format qa`). Making
the files checks every code problem's hand-written examples against its solution and computes the
hidden tests' expected values from it; each math step is evaluated, so the arithmetic is right.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_code_problems import PROBLEMS as CODE
from bench_math_problems import PROBLEMS as MATH

OUT = Path(__file__).resolve().parent.parent / "configs" / "data"


def code_row(index: int, name: str, parameters: str, returns: str, doc: str, examples: list[tuple[str, object]],
             body: str, hidden: list[str]) -> dict[str, str]:
    lines = [f"def {name}({parameters}) -> {returns}:", f'    """{doc}', ""]
    for call, result in examples:
        lines += [f"    >>> {name}({call})", f"    {result!r}"]
    prompt = "\n".join(lines + ['    """']) + "\n"
    namespace: dict[str, object] = {}
    exec(prompt + body + "\n", namespace)  # noqa: S102 (our own solution), to check the examples and compute the tests
    function = namespace[name]
    asserts = []
    for call, result in examples:
        got = eval(f"{name}({call})", namespace)
        if got != result or type(got) is not type(result):
            raise SystemExit(f"bench code {name}: the example {name}({call}) gives {got!r}, the docstring says {result!r}")
        asserts.append(f"    assert candidate({call}) == {result!r}")
    for call in hidden:
        asserts.append(f"    assert candidate({call}) == {eval(f'{name}({call})', namespace)!r}")
    assert callable(function)
    test = "def check(candidate):\n" + "\n".join(asserts) + "\n"
    return {"task_id": f"bench_code/{index}", "prompt": prompt, "canonical_solution": body + "\n", "test": test,
            "entry_point": name}


def _number(value: float) -> str:
    value = round(value, 6)
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def math_row(question: str, steps: str) -> dict[str, str]:
    namespace: dict[str, float] = {}
    lines = []
    for step in steps.split(";"):
        name, expression = (part.strip() for part in step.split("=", 1))
        namespace[name] = eval(expression, {"__builtins__": {}}, dict(namespace))
        lines.append(f"{name} = {expression} = {_number(namespace[name])}")
    answer = _number(namespace[name])
    return {"question": question, "answer": "\n".join(lines) + f"\n#### {answer}"}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    code = [code_row(i, *problem) for i, problem in enumerate(CODE)]
    math = [math_row(*problem) for problem in MATH]
    for path, rows in ((OUT / "bench_code.jsonl", code), (OUT / "bench_math.jsonl", math)):
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        print(f"{path}: {len(rows)} problems")


if __name__ == "__main__":
    main()
