"""The descriptions the configuration reference shows, read from the models' source.

The attribute docstrings under each field are where the models say what a key means;
pydantic keeps them only when a model asks it to, so they are parsed from the source here,
apart from the page's walk over the models.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
import types
from collections.abc import Sequence
from functools import cache

import pydantic
from pydantic.fields import FieldInfo


@cache
def _attribute_docstrings(cls: type) -> dict[str, str]:
    """The string literal after each annotated attribute of the class's own body.

    Pydantic copies these into ``Field.description`` only with ``use_attribute_docstrings``,
    which the models may not turn on; reading the source works either way.
    """
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    tree = ast.parse(source)
    body = next(
        (n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__),
        [],
    )
    return _docstrings_after_assignments(body)


@cache
def module_docstrings(module: types.ModuleType) -> dict[str, str]:
    """Attribute docstrings of a module's top-level names (type aliases such as ``Duration``)."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return {}
    return _docstrings_after_assignments(ast.parse(source).body)


def _docstrings_after_assignments(body: Sequence[ast.stmt]) -> dict[str, str]:
    found: dict[str, str] = {}
    for statement, after in itertools.pairwise(body):
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            name = statement.target.id
        elif (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
        ):
            name = statement.targets[0].id
        else:
            continue
        if (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            found[name] = inspect.cleandoc(after.value.value)
    return found


def field_description(model: type[pydantic.BaseModel], name: str, info: FieldInfo) -> str:
    """The field's own description, else its docstring in the nearest class that has one."""
    if info.description:
        return info.description
    for cls in model.__mro__:
        if isinstance(cls, type) and issubclass(cls, pydantic.BaseModel):
            docstring = _attribute_docstrings(cls).get(name)
            if docstring:
                return docstring
    return ""


def model_description(model: type[pydantic.BaseModel]) -> str:
    """A model's docstring stands in for a field that has none and holds just that model."""
    return inspect.cleandoc(model.__doc__) if model.__doc__ else ""
