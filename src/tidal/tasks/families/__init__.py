"""Built-in task families: generated tasks of graded difficulty, one module per family.

Importing this package registers the built-in families; a user family registers itself with
`@family("name")` on a `(rng, difficulty) -> Draft` function.
"""

from tidal.tasks.families import (  # noqa: F401
    agent_chores,
    arithmetic,
    code_functions,
    general,
    knowledge,
    math_words,
    python_functions,
    reasoning,
)
from tidal.tasks.families.registry import (
    Draft,
    FamilySpec,
    family,
    generate_tasks,
    get_family,
    known_families,
)

__all__ = ["Draft", "FamilySpec", "family", "generate_tasks", "get_family", "known_families"]
