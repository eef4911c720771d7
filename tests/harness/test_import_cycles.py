"""harness.import_cycles: import cycles among a project's own modules fail `make lint`."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.import_cycles import build_graph, find_cycles, find_modules, main

REPOSITORY = Path(__file__).resolve().parents[2]


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return root


def cycles_in(root: Path) -> list[list[str]]:
    return find_cycles(build_graph(find_modules([root])))


def test_a_cycle_hidden_inside_a_function_is_found_and_fails_the_check(tmp_path, capsys):
    write_tree(
        tmp_path,
        {
            "shop/__init__.py": "",
            "shop/orders.py": "from shop.payments import charge\n",
            "shop/payments.py": """
                def charge():
                    from shop import receipts
                    return receipts
            """,
            "shop/receipts.py": """
                def send():
                    import shop.orders
            """,
        },
    )

    assert cycles_in(tmp_path) == [["shop.orders", "shop.payments", "shop.receipts", "shop.orders"]]
    assert main([str(tmp_path)]) == 1
    report = capsys.readouterr().out
    assert "import cycle: shop.orders -> shop.payments -> shop.receipts -> shop.orders" in report
    assert "shop/payments.py:3: shop.payments imports shop.receipts (inside a function)" in report
    assert "shop.orders imports shop.payments (at module level)" in report


def test_an_acyclic_tree_passes(tmp_path, capsys):
    write_tree(
        tmp_path,
        {
            "shop/__init__.py": "from shop.orders import Order\n",
            "shop/orders.py": "import json\nfrom . import payments\nfrom .payments import charge\n",
            "shop/payments.py": "import numpy\nfrom shop import receipts\n",
            "shop/receipts.py": "from typing import TYPE_CHECKING\n",
        },
    )

    assert cycles_in(tmp_path) == []
    assert main([str(tmp_path)]) == 0
    assert "no import cycles among 4 modules" in capsys.readouterr().out


def test_relative_imports_resolve_to_the_module_they_name(tmp_path):
    write_tree(
        tmp_path,
        {
            "shop/__init__.py": "",
            "shop/billing/__init__.py": "",
            "shop/billing/invoice.py": "from ..stock import count\n",
            "shop/stock.py": "def count():\n    from .billing import invoice\n",
        },
    )

    assert cycles_in(tmp_path) == [["shop.billing.invoice", "shop.stock", "shop.billing.invoice"]]


def test_an_import_only_for_type_checking_still_counts_and_is_labelled_so(tmp_path, capsys):
    write_tree(
        tmp_path,
        {
            "left.py": "import right\n",
            "right.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import left\n",
        },
    )

    assert cycles_in(tmp_path) == [["left", "right", "left"]]
    assert main([str(tmp_path)]) == 1
    assert "right imports left (only for type checking)" in capsys.readouterr().out


def test_a_package_re_exporting_its_modules_is_no_cycle(tmp_path):
    # NOTE: every module of a package runs its __init__.py first; that is not an import edge.
    write_tree(
        tmp_path,
        {
            "engine/__init__.py": "from engine.core import Engine\n",
            "engine/core.py": "from engine.config import Config\nclass Engine: ...\n",
            "engine/config.py": "class Config: ...\n",
        },
    )

    assert cycles_in(tmp_path) == []


def test_a_file_that_is_not_python_is_reported_not_skipped(tmp_path, capsys):
    write_tree(tmp_path, {"broken.py": "def (:\n"})

    assert main([str(tmp_path)]) == 2
    assert "broken.py:1" in capsys.readouterr().err


def test_a_path_that_does_not_exist_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "missing")])
    assert exit_.value.code == 2


def test_this_repository_has_no_import_cycles(monkeypatch, capsys):
    monkeypatch.chdir(REPOSITORY)

    assert main([]) == 0, capsys.readouterr().out
