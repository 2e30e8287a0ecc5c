"""Clients generated from openapi.json work: openapi-python-client makes a Python client without a
warning, and every response openapi.json documents for each operation, as the Procfile's gunicorn
sends it, parses into that response's model; openapi-typescript makes types that `tsc` compiles
with tests/typescript/check.ts. The tools are pinned in requirements-dev.txt and
tests/typescript/package-lock.json (`npm ci`, run by .ci/run)."""

import contextlib
import datetime
import importlib
import os
import shutil
import subprocess
import sys

import httpx
import pytest
import requests
import services
from contract import DOCUMENT
from githubscanning import PATH as SCANNING_PATH, Signer, report, serving_keys
from liveserver import BIN, ROOT, addresses, cli_session, free_port, make_key, service_env, serving

PACKAGE = "api_key_demo_service_client"
TYPESCRIPT = ROOT / "tests" / "typescript"
TINY_TIERS = "free=100000/hour,tiny=2/minute"
MALFORMED_KEY = "sk_live_" + "A" * 38


def documented_responses():
    """(operation id, status) for every response of every operation in openapi.json."""
    return sorted((operation["operationId"], int(status))
                  for item in DOCUMENT["paths"].values() for operation in item.values()
                  for status in operation["responses"])


def operation(operation_id):
    return next(operation for item in DOCUMENT["paths"].values() for operation in item.values()
                if operation["operationId"] == operation_id)


def model_name(operation_id, status):
    """The name of the generated model for a response: its schema's, or the generator's for an inline one."""
    response = operation(operation_id)["responses"][str(status)]
    if "$ref" in response:
        response = DOCUMENT["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    schema = response["content"]["application/json"]["schema"]
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        # An array is parsed into a list of its items' model.
        items = DOCUMENT["components"]["schemas"][name].get("items", {})
        return "list" if "$ref" in items else name
    return "".join(word.capitalize() for word in operation_id.split("_")) + f"Response{status}"


def error_codes(schema_name):
    return DOCUMENT["components"]["schemas"][schema_name]["properties"]["error"]["properties"]["code"]["enum"]


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """openapi-python-client's output for openapi.json: (its console output, the imported package)."""
    output = tmp_path_factory.mktemp("python-client") / "client"
    # The generator formats its output with ruff, which it finds on PATH.
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    result = subprocess.run([sys.executable, "-m", "openapi_python_client", "generate", "--path",
                             str(ROOT / "openapi.json"), "--output-path", str(output)],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(output))
        package = importlib.import_module(PACKAGE)
        yield result.stdout + result.stderr, package
    for name in [name for name in sys.modules if name == PACKAGE or name.startswith(PACKAGE + ".")]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    with contextlib.ExitStack() as stack:
        yield from started_servers(tmp_path_factory, stack)


def started_servers(tmp_path_factory, stack):
    """The live servers and the keys that make each response happen: one server as deployed, and
    one whose rate-limit storage cannot be reached (keyed requests fail closed with a 503)."""
    tmp_path = tmp_path_factory.mktemp("clients")
    github_keys = stack.enter_context(serving_keys(SIGNER))
    env = service_env(tmp_path, RATE_LIMIT_TIERS=TINY_TIERS, PUBLIC_RATE_LIMIT="5/minute", TRUSTED_PROXIES="1",
                      GITHUB_SECRET_SCANNING="on", GITHUB_SECRET_SCANNING_KEYS_URL=github_keys.url)
    with cli_session(env) as commands:  # the keys' commands in one process
        keys = {name: make_key(env, tier, commands) for name, tier in
                [("full", "free"), ("tiny", "tiny"), ("doomed", "free"), ("revoked", "free")]}
        keys["scoped"] = commands("keys", "create", "carol", "--name", "sockets only", "--type", "development",
                                  "--scopes", "time:stream").strip().splitlines()[-1]
        # Allowed only from an address no generated client uses (they take theirs from `addresses`).
        keys["fenced"] = commands("keys", "create", "carol", "--name", "fenced", "--type", "development",
                                  "--allow-ips", "192.0.2.1").strip().splitlines()[-1]
        keys["credited"] = commands("keys", "create", "carol", "--name", "credited", "--type", "development",
                                    "--credits", "2", "--refill", "500/day").strip().splitlines()[-1]
    # A key of a tier the server no longer configures is refused with a 500.
    keys["retired"] = make_key(dict(env, RATE_LIMIT_TIERS=f"{TINY_TIERS},retired=5/minute"), "retired")
    broken_path = tmp_path_factory.mktemp("clients-broken")
    broken_env = service_env(broken_path, RATELIMIT_STORAGE_URL=f"redis://127.0.0.1:{free_port()}/0")
    keys["broken"] = make_key(broken_env)
    with serving(tmp_path, env) as server, serving(broken_path, broken_env) as broken:
        yield {"server": server, "broken": broken}, keys


def client(package, base, key=None):
    """A generated client with its own client address (TRUSTED_PROXIES=1), so that its per-IP
    allowance is its own; with a key, an AuthenticatedClient that sends it in X-API-Key."""
    options = {"base_url": base, "headers": {"X-Forwarded-For": next(addresses)}, "timeout": httpx.Timeout(10.0),
               "raise_on_unexpected_status": True}
    if key is None:
        return package.Client(**options)
    return package.AuthenticatedClient(token=key, prefix="", auth_header_name="X-API-Key", **options)


def call(package, operation_id, made):
    tag = operation(operation_id)["tags"][0]
    return importlib.import_module(f"{PACKAGE}.api.{tag}.{operation_id}").sync_detailed(
        client=made, **ARGUMENTS.get(operation_id, {}))


SIGNER = Signer("a1" * 32)
# What an operation with a body or header parameters is called with: the generated client sends it;
# each of its responses is the server's real answer to a report made with requests, replayed.
ARGUMENTS = {"github_secret_scanning": {"body": [], "github_public_key_identifier": SIGNER.identifier,
                                        "github_public_key_signature": "MEUCIQ=="}}


def scanning_answer(bases, status):
    """The live server's real answer of that status to a GitHub report."""
    base, address = bases["server"].base + SCANNING_PATH, {"X-Forwarded-For": next(addresses)}
    signed = report("sk_live_" + "x" * 38)
    if status == 404:  # the other server does not serve reports
        return requests.post(bases["broken"].base + SCANNING_PATH, data=signed, timeout=10,
                             headers=SIGNER.headers(signed))
    if status == 413:
        big = b"[" + b" " * (1024 * 1024) + b"]"
        return requests.post(base, data=big, timeout=10, headers={**SIGNER.headers(big), **address})
    body = {400: b'{"not": "a report"}'}.get(status, signed)
    headers = {**SIGNER.headers(body), **address} if status != 401 else address
    for _ in range(10):
        answer = requests.post(base, data=body, timeout=10, headers=headers)
        if answer.status_code == status:
            return answer
    raise AssertionError(f"the report never answered {status}")


def until(package, operation_id, made, status):
    """Call the operation until it answers status (a window running out); return that response."""
    for _ in range(10):
        response = call(package, operation_id, made)
        if response.status_code == status:
            return response
    raise AssertionError(f"{operation_id} never answered {status}")


def replay(package, captured):
    """A client whose every request gets `captured`, a real response of the live server."""
    made = package.Client(base_url="http://replay.invalid", raise_on_unexpected_status=True)
    made.set_httpx_client(httpx.Client(base_url="http://replay.invalid", transport=httpx.MockTransport(
        lambda request: httpx.Response(captured.status_code, headers=captured.headers, content=captured.content))))
    return made


KEYED = {"protected_test", "user_me", "usage_stats", "usage_history"}
# How each documented response is made to happen on a live server, and the error code it carries.
# A status that cannot happen there for that operation (a 500 or 503 of a public endpoint, on a
# healthy server) is the same status of a keyed endpoint, as the server sent it, replayed.
LIVE_401_KEYS = {"protected_test": (None, "missing_api_key"), "user_me": (MALFORMED_KEY, "invalid_api_key"),
                 "usage_stats": ("revoked", "invalid_api_key"), "usage_history": (MALFORMED_KEY, "invalid_api_key"),
                 "revoke_leaked_key": (None, "missing_api_key")}


def respond(package, servers, operation_id, status):
    """The generated client's Response for this operation and status, and the error code expected."""
    bases, keys = servers
    base = bases["server"].base
    if operation_id == "github_secret_scanning" and status not in (500, 503):
        codes = {400: "invalid_request", 401: "invalid_signature", 404: "not_found", 413: "payload_too_large",
                 429: "rate_limit_exceeded"}
        return call(package, operation_id, replay(package, scanning_answer(bases, status))), codes.get(status)
    if status == 400:
        # The generated client sends a well-formed head: the server's refusal of a malformed one, replayed.
        captured = requests.get(base + "/api/v1/status", headers={"Content-Length": "sBA?cR*4"}, timeout=10)
        assert captured.status_code == 400
        return call(package, operation_id, replay(package, captured)), "bad_request"
    if status == 200:
        key = {"revoke_leaked_key": keys["doomed"]}.get(operation_id, keys["full"] if operation_id in KEYED else None)
        return call(package, operation_id, client(package, base, key)), None
    if status == 401:
        key, code = LIVE_401_KEYS[operation_id]
        if key == "revoked":
            key = keys["revoked"]
            revoked = requests.post(base + "/api/v1/keys/revoke", timeout=10,
                                    headers={"X-API-Key": key, "X-Forwarded-For": next(addresses)})
            assert revoked.status_code == 200
        return call(package, operation_id, client(package, base, key)), code
    if status == 403:
        return call(package, operation_id, client(package, base, keys["scoped"])), "insufficient_scope"
    if status == 429:
        key = keys["tiny"] if operation_id in KEYED else None
        return until(package, operation_id, client(package, base, key), 429), "rate_limit_exceeded"
    if status == 413:
        # The generated client sends no body: the server's answer to one too large, replayed.
        captured = requests.post(base + "/api/v1/keys/revoke", data=b"x" * 70_000, timeout=10,
                                 headers={"X-Forwarded-For": next(addresses)})
        assert captured.status_code == 413
        return call(package, operation_id, replay(package, captured)), "payload_too_large"
    if status in (500, 503):
        key, server = (keys["retired"], bases["server"]) if status == 500 else (keys["broken"], bases["broken"])
        code = "internal_error" if status == 500 else "service_unavailable"
        made = client(package, server.base, key)
        if operation_id in KEYED:
            return call(package, operation_id, made), code
        captured = requests.get(server.base + "/api/v1/protected/test", headers={"X-API-Key": key}, timeout=10)
        assert captured.status_code == status
        return call(package, operation_id, replay(package, captured)), code
    raise AssertionError(f"no way to make {operation_id} answer {status}")


def test_the_python_client_is_generated_without_a_warning(generated):
    output, package = generated
    assert "warning" not in output.lower(), output
    assert "Unable to" not in output and "Skipping" not in output, output
    models = importlib.import_module(f"{PACKAGE}.models")
    for name in DOCUMENT["components"]["schemas"]:
        if DOCUMENT["components"]["schemas"][name].get("type") == "object":
            assert hasattr(models, name), name


@pytest.mark.parametrize("operation_id, status", documented_responses())
def test_every_documented_response_parses_into_its_model(generated, servers, operation_id, status):
    _, package = generated
    response, code = respond(package, servers, operation_id, status)
    assert response.status_code == status, response.content
    assert type(response.parsed).__name__ == model_name(operation_id, status)
    if code is not None:
        schema = model_name(operation_id, status)
        assert response.parsed.error.code == code
        assert response.parsed.error.code in error_codes(schema)
        assert response.parsed.error.message


@pytest.mark.parametrize("operation_id", sorted(KEYED))
def test_a_key_refused_by_its_allow_list_parses_into_the_403_model(generated, servers, operation_id):
    _, package = generated
    bases, keys = servers
    response = call(package, operation_id, client(package, bases["server"].base, keys["fenced"]))
    assert response.status_code == 403, response.content
    schema = model_name(operation_id, 403)
    assert type(response.parsed).__name__ == schema
    assert response.parsed.error.code == "ip_not_allowed" and "ip_not_allowed" in error_codes(schema)
    assert response.parsed.error.message


def test_credits_parse_into_their_models(generated, servers):
    _, package = generated
    bases, keys = servers
    made = client(package, bases["server"].base, keys["credited"])
    stats = call(package, "usage_stats", made)
    assert stats.status_code == 200 and stats.headers["X-Credits-Remaining"] == "1"
    # The generator renames the field credits_ (credits is a Python builtin); the JSON keeps its name.
    credits = stats.parsed.credits_
    assert type(credits).__name__ == "Credits" and credits.remaining == 1
    assert (credits.refill.amount, credits.refill.interval) == (500, "day")
    assert credits.refill.next_at.time() == datetime.time(0) and credits.refill.next_at.tzinfo is not None
    assert call(package, "protected_test", made).status_code == 200
    refused = call(package, "protected_test", made)
    assert refused.status_code == 429 and type(refused.parsed).__name__ == "RateLimited"
    assert refused.parsed.error.code == "credits_exhausted" in error_codes("RateLimited")
    assert 0 < int(refused.headers["Retry-After"]) <= 86400
    # A key without credits leaves the field unset, as before credits existed.
    assert isinstance(call(package, "usage_stats", client(package, bases["server"].base, keys["full"])).parsed.credits_,
                      type(package.types.UNSET))


@pytest.mark.parametrize("method, path, model, code", [
    ("GET", "/api/v1/nothing", "NotFound", "not_found"),
    ("DELETE", "/api/v1/status", "MethodNotAllowed", "method_not_allowed"),
])
def test_answers_outside_the_operations_parse_into_their_models(generated, servers, method, path, model, code):
    _, package = generated
    bases, _ = servers
    response = requests.request(method, bases["server"].base + path, timeout=10)
    parsed = getattr(importlib.import_module(f"{PACKAGE}.models"), model).from_dict(response.json())
    assert parsed.error.code == code and parsed.error.message


def test_the_typescript_types_compile_with_a_client_that_uses_them(tmp_path):
    if shutil.which("node") is None or shutil.which("npm") is None:
        services.unavailable("Node.js and npm are not installed")
    tools = TYPESCRIPT / "node_modules" / ".bin"
    if not (tools / "openapi-typescript").exists():
        services.unavailable("the TypeScript tools are not installed (npm ci --prefix tests/typescript)")
    generated = subprocess.run([str(tools / "openapi-typescript"), str(ROOT / "openapi.json"), "-o",
                                str(tmp_path / "api.ts")], capture_output=True, text=True, timeout=120)
    assert generated.returncode == 0, generated.stdout + generated.stderr
    # It prints its name and the file it wrote; anything more is a warning.
    lines = [line for line in (generated.stdout + generated.stderr).splitlines() if line.strip()]
    assert [line.split()[0] for line in lines] == ["✨", "🚀"], lines
    assert 'code: "missing_api_key" | "invalid_api_key";' in (tmp_path / "api.ts").read_text()

    shutil.copy(TYPESCRIPT / "check.ts", tmp_path / "check.ts")
    checked = subprocess.run([str(tools / "tsc"), "--noEmit", "--strict", "--target", "es2022", "--module", "esnext",
                              "--moduleResolution", "bundler", str(tmp_path / "check.ts")],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
