"""`--help` for the service entrypoints (sapo-generator, sapo-sampler, sapo-trainer).

The services are configured only through the environment, so their help is the list of variables
their settings class reads, with defaults and descriptions taken from the class itself. Any other
argument is refused (exit status 2), so a stray `args:` in a deployment fails loudly at start.

    def main() -> int:
        parse_service_args("sapo-sampler", "Filters groups and assembles batches.", SamplerSettings)
        settings = load_settings(SamplerSettings)
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from enum import Enum

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None or field.default is PydanticUndefined:
        return "see description"
    if field.default is None:
        return "unset"
    value = field.default.value if isinstance(field.default, Enum) else field.default
    return f"default {value}"


def env_variables(cls: type[BaseModel], prefix: str) -> Iterator[tuple[str, str]]:
    """(variable, 'default; description') for every field, nested models flattened with `__`."""
    for name, field in cls.model_fields.items():
        variable = f"{prefix}{name.upper()}"
        annotation = field.annotation
        nested = [a for a in getattr(annotation, "__args__", (annotation,)) if isinstance(a, type)]
        models = [a for a in nested if issubclass(a, BaseModel)]
        if models:
            yield from env_variables(models[0], variable + "__")
            continue
        yield variable, f"{_default(field)}; {field.description or ''}".rstrip("; ")


def settings_help(cls: type[BaseSettings]) -> str:
    prefix = str(cls.model_config.get("env_prefix", ""))
    rows = list(env_variables(cls, prefix))
    width = max(len(variable) for variable, _ in rows)
    lines = [f"  {variable.ljust(width)}  {text}" for variable, text in rows]
    return "settings (environment variables):\n" + "\n".join(lines)


def parse_service_args(
    prog: str, description: str, settings: type[BaseSettings], argv: Sequence[str] | None = None
) -> None:
    """Print the help and exit 0 on -h/--help; exit 2 on any other argument; return otherwise."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=settings_help(settings),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.parse_args(argv)
