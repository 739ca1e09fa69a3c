"""Each store adapter owns its driver: asyncpg is imported only in ``stores/postgres/``,
redis only in ``stores/redis/`` (the developer tools, which start and break real stores,
excepted), and neither adapter imports the other. Read from the source with ``ast``, so
imports under ``TYPE_CHECKING`` and inside functions count too."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import ibex_context
import ibex_operator

SERVICE = Path(ibex_context.__file__).parent
OPERATOR = Path(ibex_operator.__file__).parent
POSTGRES = SERVICE / "stores" / "postgres"
REDIS = SERVICE / "stores" / "redis"
DEVTOOLS = SERVICE / "devtools"


def imported_modules(path: Path, package: str) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in the module at ``path``, which
    belongs to ``package`` (relative imports resolved against it)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            yield node.lineno, module
            # ``from ibex_context.stores import redis`` names a module too.
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def modules_under(root: Path, top: str) -> Iterator[tuple[Path, str]]:
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).with_suffix("")
        parts = [top, *relative.parts]
        if parts[-1] == "__init__":
            parts.pop()
            yield path, ".".join(parts)
        else:
            yield path, ".".join(parts[:-1])


def imports_of(module: str, roots: tuple[tuple[Path, str], ...]) -> list[str]:
    """``path:line`` of every import of ``module`` (or a submodule) under ``roots``."""
    found = []
    for root, top in roots:
        for path, package in modules_under(root, top):
            for line, name in imported_modules(path, package):
                if name == module or name.startswith(module + "."):
                    found.append(f"{path.relative_to(root.parent)}:{line}")
    return sorted(set(found))


def outside(found: list[str], *allowed: Path) -> list[str]:
    prefixes = tuple(f"{p.relative_to(SERVICE.parent)}/" for p in allowed)
    return [where for where in found if not where.startswith(prefixes)]


EVERYTHING = ((SERVICE, "ibex_context"), (OPERATOR, "ibex_operator"))


def test_asyncpg_is_imported_only_by_the_postgres_adapter() -> None:
    assert outside(imports_of("asyncpg", EVERYTHING), POSTGRES, DEVTOOLS) == []


def test_redis_is_imported_only_by_the_redis_adapter() -> None:
    assert outside(imports_of("redis", EVERYTHING), REDIS, DEVTOOLS) == []


def test_the_postgres_adapter_imports_nothing_of_the_redis_adapter() -> None:
    assert imports_of("ibex_context.stores.redis", ((POSTGRES, "ibex_context.stores.postgres"),)) == []


def test_the_redis_adapter_imports_nothing_of_the_postgres_adapter() -> None:
    assert imports_of("ibex_context.stores.postgres", ((REDIS, "ibex_context.stores.redis"),)) == []


def test_the_check_sees_an_import_it_must_refuse(tmp_path: Path) -> None:
    """The rules above would pass on a tree they cannot read: show they see one."""
    module = tmp_path / "pkg" / "reads.py"
    module.parent.mkdir()
    module.write_text("import asyncpg\nfrom .. import redis\nfrom redis.exceptions import RedisError\n")
    found = imports_of("redis", ((tmp_path / "pkg", "pkg"),))
    assert found == ["pkg/reads.py:3"]
    assert imports_of("asyncpg", ((tmp_path / "pkg", "pkg"),)) == ["pkg/reads.py:1"]
