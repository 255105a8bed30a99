"""The auditor on a corpus of broken and sound tasks (bench/audit_corpus): which broken tasks it
flags (recall) and which sound ones it flags (false positives). A task counts as flagged when its
verdict is `warn` or `quarantine`; `metadata.expect` (broken | ok) and `metadata.kind` say what
each task is. The corpus holds task files and terminal-task folders.

`--baseline-commit COMMIT` (or `--baseline-src DIR`) measures a second source tree, that commit's
src/ exported with `git archive`, on the same corpus in a subprocess, so the table shows before and after side by side. A baseline
that cannot read part of the input (task folders) counts those tasks as not flagged.

    python bench/audit.py --corpus                                 # k = 2, writes RESULTS.md
    python bench/audit.py --corpus --baseline-commit af2f0b9       # with a before column
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_md import command_line, write_section

SECTION = "## Task audit: recall on a broken-task corpus"
CORPUS = Path(__file__).resolve().with_name("audit_corpus")
BUILT_IN = "built-in"  # the key of the built-in families' figures among the verdicts


def corpus_labels(corpus: Path = CORPUS) -> dict[str, dict[str, str]]:
    """Task id -> {expect, kind} from the task files' and task folders' metadata."""
    labels: dict[str, dict[str, str]] = {}
    for path in sorted(corpus.rglob("*.yaml")):
        for record in yaml.safe_load(path.read_text()):
            meta = record.get("metadata", {})
            labels[record["id"]] = {"expect": meta["expect"], "kind": meta.get("kind", "sound")}
    for toml in sorted(corpus.rglob("task.toml")):
        meta = tomllib.loads(toml.read_text()).get("metadata", {})
        labels[toml.parent.name] = {"expect": meta["expect"], "kind": meta.get("kind", "sound (agent)")}
    return labels


def run_audit(corpus: Path, reference_runs: int, jobs: int) -> dict[str, dict[str, object]]:
    """Audit the corpus with the `tidal` on sys.path; task id -> verdict and the flagging checks."""
    from tidal.audit import audit_tasks
    from tidal.config.schema import AuditConfig

    config = AuditConfig(reference_runs=reference_runs, max_mutants=6)
    result = audit_tasks([corpus], config, jobs=jobs, progress=False)
    verdicts: dict[str, dict[str, object]] = {
        a.task_id: {"verdict": a.verdict, "checks": sorted({f.check for f in a.findings if f.severity != "info"})}
        for a in result.audits}
    verdicts[BUILT_IN] = built_in(config, jobs)
    return verdicts


def built_in(config: object, jobs: int) -> dict[str, object]:
    """The built-in agent tasks (5 per split, levels 1-5, every check): how many are quarantined;
    and every built-in family (150 tasks per split, the duplicates check): how many are flagged as
    a near-duplicate across splits, by kind (paraphrase, short, tests, ...)."""

    from tidal.audit import audit_tasks
    from tidal.tasks import generate_tasks, known_families, write_tasks

    families: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory() as folder:
        agent = Path(folder) / "agent.jsonl"
        write_tasks([t for split in ("train", "eval") for t in generate_tasks("agent", 5, split, 0, 1, 5)], agent)
        agent_audits = audit_tasks([agent], config, jobs=jobs, progress=False).audits  # type: ignore[arg-type]
        for name in known_families():
            path = Path(folder) / f"{name}.jsonl"
            write_tasks([t for split in ("train", "eval") for t in generate_tasks(name, 150, split, 0, 1, 5)], path)
            audits = audit_tasks([path], config, checks=["duplicates"], progress=False).audits  # type: ignore[arg-type]
            kinds: dict[str, int] = {"tasks": len(audits)}
            for audit in audits:
                for finding in audit.findings:
                    if finding.evidence.get("across_splits") and finding.severity != "info":
                        kinds[finding.evidence["kind"]] = kinds.get(finding.evidence["kind"], 0) + 1
            families[name] = kinds
    return {"agent_tasks": len(agent_audits), "agent_quarantined": sum(a.verdict == "quarantine" for a in agent_audits),
            "families": families}


def measure_in(src: Path, args: argparse.Namespace) -> dict[str, dict[str, object]]:
    """`run_audit` with the tidal of `src`, in a subprocess."""
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
            f"from audit_recall import run_audit; from pathlib import Path; "
            f"print('RESULT' + json.dumps(run_audit(Path({str(args.corpus)!r}), {args.reference_runs}, {args.jobs})))")
    env = {**os.environ, "PYTHONPATH": str(src)}
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=3600,
                          check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT")), None)
    if line is None:
        raise SystemExit(f"the audit under {src} failed:\n{done.stderr[-3000:]}")
    verdicts = json.loads(line[len("RESULT"):])
    verdicts[BUILT_IN]["seconds"] = round(time.perf_counter() - began, 1)
    return verdicts


def score(labels: dict[str, dict[str, str]], verdicts: dict[str, dict[str, object]]) -> dict[str, object]:
    """Recall and false positives of one run on the labelled corpus."""
    broken = [t for t, label in labels.items() if label["expect"] == "broken"]
    good = [t for t, label in labels.items() if label["expect"] == "ok"]

    def flagged(task_id: str) -> bool:
        return verdicts.get(task_id, {}).get("verdict", "ok") != "ok"

    return {"broken": len(broken), "good": len(good), "caught": sum(map(flagged, broken)),
            "false_positives": sum(map(flagged, good)),
            "missed": sorted(t for t in broken if not flagged(t)), "wrongly_flagged": sorted(t for t in good if flagged(t))}


def section(args: argparse.Namespace, labels: dict, runs: dict[str, dict]) -> str:
    command = "python bench/audit.py --corpus" + "".join(f" {shlex.quote(a)}" for a in sys.argv[1:] if a != "--corpus")
    names = list(runs)
    lines = [SECTION, "",
             (f"Every check on bench/audit_corpus ({sum(v['expect'] == 'broken' for v in labels.values())} broken tasks, "
              f"{sum(v['expect'] == 'ok' for v in labels.values())} sound ones, task files and terminal-task folders; "
              f"k = {args.reference_runs} reference runs, 6 mutants). A task is flagged when its verdict is warn or "
              "quarantine. " + (f"`before` is {('commit ' + args.baseline_commit) if args.baseline_commit else 'the tree of --baseline-src'}, "
                                "`after` this tree." if len(names) > 1
                                else "")), "",
             command_line(command), "",
             "| task | what it is | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for task_id, label in labels.items():
        cells = []
        for name in names:
            got = runs[name].get(task_id)
            cells.append("not read" if got is None else f"{got['verdict']} ({', '.join(got['checks'])})"
                         if got["checks"] else str(got["verdict"]))
        lines.append(f"| {task_id} | {label['expect']}: {label['kind']} | " + " | ".join(cells) + " |")
    built = [runs[n][BUILT_IN] for n in names]
    cells_b = [f"{b['agent_quarantined']}/{b['agent_tasks']} quarantined" for b in built]
    lines.append("| built-in agent tasks (5 per split, levels 1-5) | ok: `tidal eval --model oracle` passes them | "
                 + " | ".join(cells_b) + " |")
    for family in sorted({f for b in built for f in b.get("families", {})}):
        cells_f = []
        for b in built:
            kinds = b.get("families", {}).get(family)
            if kinds is None:
                cells_f.append("not measured")
                continue
            flagged = {k: v for k, v in kinds.items() if k != "tasks"}
            cells_f.append(f"{sum(flagged.values())}/{kinds['tasks']} across splits"
                           + (f" ({', '.join(f'{k} {v}' for k, v in sorted(flagged.items()))})" if flagged else ""))
        lines.append(f"| built-in {family} tasks (150 per split), duplicates only | generated train and eval splits | "
                     + " | ".join(cells_f) + " |")
    scores = [score(labels, runs[name]) for name in names]
    lines.append("| **recall, false positives** | broken tasks flagged, sound tasks flagged | " + " | ".join(
        f"**{s['caught']}/{s['broken']} broken, {s['false_positives']}/{s['good']} sound**" for s in scores) + " |")
    lines += ["", ("The kinds added for the blind spots: a workspace file holding the expected values as literals (a "
              "JSON fixture, an agent task's grader notes; the leakage check), tests that read their expected values "
              "from a starting file (JSON, CSV, a Python module; the exploit probe `answers from the workspace files`, "
              "with two sound tasks whose tests read inputs or whose job is a lookup), eval tasks that paraphrase a "
              "train task, short prompts restated with a few words changed and code tasks with the same functions and "
              "assertions (the duplicates check's `short` and `tests` keys, beside sound near-misses: the same short "
              "answer to another question, other numbers, other tests), and terminal-task folders whose reference "
              "(solution/solve.sh) runs as an oracle episode. The corpus was written together with these checks, so "
              "it shows that the blind spots are covered, not the recall on breakage nobody anticipated. The "
              "knowledge family's cross-split findings are real: it asks one fact under different templates in train "
              "and eval (`Which city is the capital of Poland?` / `Poland has which city as its capital?`; `Which "
              "element symbol stands for sodium?` / `Give the symbol of the element sodium.`), which its generator "
              "(tasks/) should stop doing; so are the agent family's (one task generated into both splits, "
              "an exact duplicate at 150 per split); the other families have none. Wall time of each run "
              "(corpus, built-in agent tasks, every family's duplicates): "
              + ", ".join(f"{n} {b['seconds']} s" for n, b in zip(names, built))
              + "; the code tasks' sandbox runs (reference, nulls, probes, mutants) take most of it, the text checks "
              "milliseconds.")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--reference-runs", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--baseline-src", type=Path, help="a second tidal source tree (its src/) to compare with")
    parser.add_argument("--baseline-commit", help="a commit of this repository to compare with (its src/, exported)")
    parser.add_argument("--results", type=Path, default=Path(__file__).with_name("RESULTS.md"))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    labels = corpus_labels(args.corpus)
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as folder:
        if args.baseline_commit:
            root = Path(__file__).resolve().parents[1]
            archive = subprocess.run(["git", "-C", str(root), "archive", args.baseline_commit, "src"], capture_output=True,
                                     check=True).stdout
            subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
            args.baseline_src = Path(folder) / "src"
        if args.baseline_src:
            runs["before"] = measure_in(args.baseline_src, args)
    runs["after"] = measure_in(Path(__file__).resolve().parents[1] / "src", args)
    for name, verdicts in runs.items():
        print(name, json.dumps(score(labels, verdicts)))
    if not args.no_write:
        write_section(args.results, SECTION, section(args, labels, runs))
        print(f"wrote the {SECTION!r} section of {args.results}")


if __name__ == "__main__":
    main()
