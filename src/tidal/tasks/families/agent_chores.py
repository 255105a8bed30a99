"""`agent`: file and shell chores in a workspace, checked by hidden pytest tests.

Levels: 1 write a given word to a file; 2 count the lines of a file; 3 sort and deduplicate a word
list; 4 tidy a folder (move the `.log` files into `logs/`, leave the rest); 5 sum a CSV column per
name into a new CSV. Each reference solution is a shell script (what `solution/solve.sh` holds in
the terminal-task layout), run by the oracle agent with one `bash` call. The expected results are
computed here from the generated data, and the tests check contents, never file modes.

The content key is the chore and its data, so eval asks for new data. The step budget grows with
the level (4 + 2 × level): a chore needs a look at the files, one or two commands and a submit.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from tidal.tasks.families.registry import Draft, family

VERIFIER = {"name": "python_tests"}
LIMITS = {"timeout_s": 20, "memory_mb": 512}
TOOLS = ["bash", "python", "read_file", "write_file", "submit"]
WORDS = ("apple", "birch", "cedar", "delta", "ember", "fjord", "grape", "hazel", "indigo", "juniper",
         "kiwi", "lemon", "maple", "nectar", "olive", "pepper", "quartz", "raven", "sage", "tulip")
NAMES = ("ana", "bo", "cy", "dee", "eli", "fay")


def _lines(values: list[str]) -> str:
    return "".join(f"{v}\n" for v in values)


def _write_word(rng: random.Random) -> Draft:
    word, name = rng.choice(WORDS), rng.choice(("note", "greeting", "answer", "label"))
    test = (f"from pathlib import Path\n\n\ndef test_content():\n"
            f"    assert Path('{name}.txt').read_text().strip() == {word!r}\n")
    return Draft(f"write:{name}:{word}", f"Create the file {name}.txt containing the single word {word}.",
                 f"printf '%s\\n' {word} > {name}.txt\n", dict(VERIFIER), {"test_chore.py": test})


def _count_lines(rng: random.Random) -> Draft:
    rows = [rng.choice(WORDS) for _ in range(rng.randint(3, 30))]
    test = ("from pathlib import Path\n\n\ndef test_count():\n"
            f"    assert Path('count.txt').read_text().strip() == '{len(rows)}'\n")
    return Draft(f"count:{','.join(rows)}", "Write the number of lines of data.txt to count.txt (just the number).",
                 "wc -l < data.txt | tr -d ' ' > count.txt\n", dict(VERIFIER), {"test_chore.py": test},
                 files={"data.txt": _lines(rows)})


def _sort_unique(rng: random.Random) -> Draft:
    rows = [rng.choice(WORDS) for _ in range(rng.randint(5, 20))]
    expected = sorted(set(rows))
    test = ("from pathlib import Path\n\n\ndef test_sorted():\n"
            f"    assert Path('sorted.txt').read_text().split() == {expected!r}\n\n\n"
            "def test_input_kept():\n"
            f"    assert Path('words.txt').read_text() == {_lines(rows)!r}\n")
    return Draft(f"sort:{','.join(rows)}",
                 "Write the distinct words of words.txt to sorted.txt, one per line, in alphabetical order. "
                 "Leave words.txt as it is.",
                 "sort -u words.txt > sorted.txt\n", dict(VERIFIER), {"test_chore.py": test},
                 files={"words.txt": _lines(rows)})


def _tidy_logs(rng: random.Random) -> Draft:
    stems = rng.sample(WORDS, rng.randint(3, 6))
    logs = stems[: rng.randint(1, len(stems) - 1)]
    files = {f"{s}.log": f"log of {s}\n" for s in logs}
    files.update({f"{s}.txt": f"text of {s}\n" for s in stems if s not in logs})
    test = ("from pathlib import Path\n\n\ndef test_logs_moved():\n"
            f"    for stem in {logs!r}:\n"
            "        assert Path('logs', stem + '.log').read_text() == f'log of {stem}\\n'\n"
            "        assert not Path(stem + '.log').exists()\n\n\n"
            "def test_others_stay():\n"
            f"    for name in {sorted(n for n in files if n.endswith('.txt'))!r}:\n"
            "        assert Path(name).is_file()\n")
    return Draft(f"tidy:{','.join(sorted(files))}",
                 "Move every .log file of the workspace into a new folder logs/ and leave the other files where they are.",
                 "mkdir -p logs && mv ./*.log logs/\n", dict(VERIFIER), {"test_chore.py": test}, files=files)


def _csv_totals(rng: random.Random) -> Draft:
    names = rng.sample(NAMES, rng.randint(2, 4))
    rows = [(rng.choice(names), rng.randint(1, 99)) for _ in range(rng.randint(4, 12))]
    totals: dict[str, int] = {}
    for name, amount in rows:
        totals[name] = totals.get(name, 0) + amount
    expected = [f"{n},{totals[n]}" for n in sorted(totals)]
    data = "name,amount\n" + "".join(f"{n},{a}\n" for n, a in rows)
    test = ("from pathlib import Path\n\n\ndef test_header():\n"
            "    assert Path('totals.csv').read_text().splitlines()[0] == 'name,total'\n\n\n"
            "def test_rows():\n"
            f"    assert Path('totals.csv').read_text().splitlines()[1:] == {expected!r}\n")
    reference = ("python3 - <<'PY'\nimport csv\ntotals = {}\nfor row in csv.DictReader(open('sales.csv')):\n"
                 "    totals[row['name']] = totals.get(row['name'], 0) + int(row['amount'])\n"
                 "with open('totals.csv', 'w') as out:\n    out.write('name,total\\n')\n"
                 "    for name in sorted(totals):\n        out.write(f'{name},{totals[name]}\\n')\nPY\n")
    return Draft(f"csv:{data}", "sales.csv has the columns name,amount. Write totals.csv with the header name,total "
                 "and one row per name with the sum of its amounts, sorted by name.",
                 reference, dict(VERIFIER), {"test_chore.py": test}, files={"sales.csv": data})


CHORES: dict[int, Callable[[random.Random], Draft]] = {
    1: _write_word, 2: _count_lines, 3: _sort_unique, 4: _tidy_logs, 5: _csv_totals,
}


@family("agent")
def make_agent_chore(rng: random.Random, difficulty: int) -> Draft:
    draft = CHORES[difficulty](rng)
    return Draft(draft.key, draft.prompt, draft.reference, draft.verifier, draft.tests, dict(LIMITS),
                 {"chore": CHORES[difficulty].__name__.lstrip("_")}, files=draft.files, tools=list(TOOLS),
                 max_steps=4 + 2 * difficulty)
