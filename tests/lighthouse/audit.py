"""Lighthouse on the Security tab and a key's page, logged in, at phone and desktop sizes; run by
hand (the performance score depends on the machine's load, so it is no test):

    npm ci --prefix tests/lighthouse && python tests/lighthouse/audit.py

Prints each page's four category scores and any weighted audit that did not pass."""

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "support"))

from liveserver import Browser, service_env, serving  # noqa: E402


def audit(url, cookie, form_factor):
    preset = ["--preset=desktop"] if form_factor == "desktop" else ["--form-factor=mobile"]
    result = subprocess.run(
        [str(HERE / "node_modules" / ".bin" / "lighthouse"), url, "--quiet", "--output=json", "--output-path=stdout",
         "--chrome-flags=--headless=new --no-sandbox", f"--extra-headers={json.dumps({'Cookie': cookie})}",
         "--only-categories=performance,accessibility,best-practices,seo", *preset],
        capture_output=True, text=True, check=True, env={"CHROME_PATH": "/usr/bin/chromium", "PATH": "/usr/bin:/bin"})
    report = json.loads(result.stdout)
    assert report["finalDisplayedUrl"] == url, f"redirected to {report['finalDisplayedUrl']}: not logged in"
    scores = {name: round(category["score"] * 100) for name, category in report["categories"].items()}
    failed = sorted({ref["id"] for category in report["categories"].values() for ref in category["auditRefs"]
                     if ref["weight"] and (report["audits"][ref["id"]]["score"] or 0) < 1
                     and report["audits"][ref["id"]]["score"] is not None})
    return scores, failed


def main():
    with (tempfile.TemporaryDirectory() as folder,
          serving(Path(folder), service_env(Path(folder)), "gunicorn") as server):
        browser = Browser(server).signup()
        for name in ("Billing service", "Nightly export job"):
            browser.create_key(name)
        key_id = re.search(r'/settings/security/keys/(\d+)"', browser.get("/settings/security").text)[1]
        cookie = "; ".join(f"{cookie.name}={cookie.value}" for cookie in browser.http.cookies)
        # localhost, not 127.0.0.1: Lighthouse treats it as a secure context, as it would HTTPS.
        base = server.base.replace("127.0.0.1", "localhost")
        for path in ("/settings/security", f"/settings/security/keys/{key_id}"):
            for form_factor in ("mobile", "desktop"):
                scores, failed = audit(base + path, cookie, form_factor)
                print(f"{path} ({form_factor}): {scores}" + (f"; not passed: {', '.join(failed)}" if failed else ""))


if __name__ == "__main__":
    main()
