"""tasks layer: task files (load and write), built-in task families of graded difficulty, and the
reference answer a correct model response would be."""

from tidal.tasks.families import Draft, family, generate_tasks, known_families
from tidal.tasks.loader import load_tasks, write_tasks
from tidal.tasks.reference import reference_answer

__all__ = [
    "Draft",
    "family",
    "generate_tasks",
    "known_families",
    "load_tasks",
    "reference_answer",
    "write_tasks",
]
