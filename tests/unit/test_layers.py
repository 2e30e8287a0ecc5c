"""The import contracts of .importlinter: kept by the checkout, and broken by an import that runs up
a tier or against a tier's own order, by two rooms or two files of a room that import each other."""

import copy
import subprocess
import sys

import layering
import pytest
from importlinter.api import read_configuration

CONTRACTS = {options["id"]: options for options in
             read_configuration(str(layering.ROOT / ".importlinter"))["contracts_options"]}
CONTRACT_TYPES = {"checkout_layers": layering.CheckoutLayersContract,
                  "checkout_acyclic_siblings": layering.CheckoutAcyclicSiblingsContract,
                  "checkout_acyclic_rooms": layering.CheckoutAcyclicRoomsContract}


def contract(contract_id):
    options = {name: value for name, value in CONTRACTS[contract_id].items() if name not in ("id", "name", "type")}
    return CONTRACT_TYPES[CONTRACTS[contract_id]["type"]](name=CONTRACTS[contract_id]["name"], session_options={},
                                                       contract_options=options)


def test_the_checkout_keeps_every_contract_as_lint_imports_runs_them():
    run = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                          "lint_imports_command()"], cwd=layering.ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in run.stdout


def test_the_tiers_are_the_six_of_the_design():
    tiers = [layer.strip() for layer in CONTRACTS["tiers"]["layers"]]
    assert tiers == ["app : cli : gunicorn_conf", "api : sockets : web : webhooks : serving : ws : integrations",
                     "auth | ratelimit", "accounts : keys : metering : mail : orgs : ops : billing", "models",
                     "store : settings : openapi"]


def test_the_graph_has_every_import_including_those_inside_functions():
    graph = layering.checkout_graph()
    # gunicorn.conf.py imports sockets inside post_worker_init, once the worker has forked.
    assert "sockets" in graph.find_modules_directly_imported_by("gunicorn_conf")
    # `from webhooks import delivery as ..., models as ...` imports each module it names.
    assert {"webhooks.delivery", "webhooks.models", "webhooks.outbox"} <= graph.find_modules_directly_imported_by("app")
    assert not {"tests", "bench", "tools"} & {module.split(".")[0] for module in graph.modules}


@pytest.mark.parametrize("contract_id, importer, imported", [
    ("tiers", "models", "auth"),
    ("tiers", "metering.usage", "webhooks.outbox"),
    ("tiers", "ops.note", "serving.envelope"),
    ("tiers", "keys.lookup", "ratelimit"),
    ("tiers", "accounts.users", "web.security"),
    ("entry", "cli.keys", "app"),
    ("transport", "serving.envelope", "api"),
    ("transport", "ws.wsserver", "sockets"),
    ("domain", "ops.logs", "accounts.users"),
    ("domain", "keys.lookup", "accounts.users"),
    ("domain", "orgs.members", "billing.customers"),
    ("storage", "settings", "store.connections"),
    ("rooms", "store.ids", "models"),
    ("rooms", "ops.note", "mail.outbox"),
    ("files", "cli.orgs", "cli.keys"),
    ("files", "web.reference", "web.home"),
    ("files", "store.statements", "store.schema"),
])
def test_an_import_against_the_rule_breaks_its_contract(monkeypatch, contract_id, importer, imported):
    assert contract(contract_id).check(None, verbose=False).kept
    graph = copy.deepcopy(layering.checkout_graph())
    graph.add_import(importer=importer, imported=imported, line_number=1, line_contents=f"import {imported}")
    if contract_id == "files":
        # Back the other way too, where the room does not import so already: a circle of two files.
        graph.add_import(importer=imported, imported=importer, line_number=1, line_contents=f"import {importer}")
    monkeypatch.setattr(layering, "checkout_graph", lambda: graph)
    assert not contract(contract_id).check(None, verbose=False).kept


def test_no_module_of_the_service_the_tests_or_the_benchmarks_passes_400_lines():
    """One concern a module (docs/development.md, "Layout")."""
    folders = [layering.ROOT / "tests", layering.ROOT / "bench"]
    modules = [*layering.service_files(), *(path for folder in folders for path in folder.rglob("*.py")
                                            if "node_modules" not in path.parts)]
    assert len(modules) > 300
    too_long = {str(path.relative_to(layering.ROOT)): lines for path in modules
                if (lines := len(path.read_text(encoding="utf-8").splitlines())) > 400}
    assert too_long == {}
