"""Built-in task families: generated tasks of graded difficulty, one module per family.

Importing this package registers the built-in families; a user family registers itself with
`@family("name")` on a `(rng, difficulty) -> Draft` function.
"""

from tidal.tasks.families import agent_chores, arithmetic, general, knowledge, python_functions, reasoning  # noqa: F401
from tidal.tasks.families.registry import (
    Draft,
    FamilySpec,
    family,
    generate_tasks,
    get_family,
    known_families,
)

__all__ = ["Draft", "FamilySpec", "family", "generate_tasks", "get_family", "known_families"]
