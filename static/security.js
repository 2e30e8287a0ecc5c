// The Security tab's script: copies a secret shown once (a new key's, a webhook endpoint's, the
// recovery codes), hands a new key to the playground through this tab's sessionStorage, and refreshes
// an endpoint's attempts while a test event waits for its first one. Without it the page works as
// plain HTML: a secret is selected by hand, an attempt seen on reload.

// The text of a field, or of a list (the recovery codes, one a line), onto the clipboard: said on
// the button at once, whatever the clipboard does. The text is selected first, so that Ctrl+C copies
// it when nothing else can.
function copy(button, source) {
  const field = source.matches("input, textarea");
  const text = field ? source.value : source.innerText.trim();
  source.focus();
  if (field) {
    source.select();
  } else {
    getSelection().selectAllChildren(source);
  }
  // The clipboard gets the text itself, not a rendering of the selection (a list's markers).
  const put = event => {
    event.clipboardData.setData("text/plain", text);
    event.preventDefault();
  };
  document.addEventListener("copy", put);
  let copied = false;
  try {
    // Synchronous, inside the click: it works where navigator.clipboard is missing (a page served
    // over http from another host than localhost) and answers at once.
    copied = document.execCommand("copy");
  } catch {
    copied = false;
  } finally {
    document.removeEventListener("copy", put);
  }
  if (copied) {
    button.textContent = "Copied";
    button.focus();
    return;
  }
  // The focus stays on the selected text, where Ctrl+C copies it.
  button.textContent = "Selected: press Ctrl+C";
  if (navigator.clipboard) {
    // A clipboard that answers late (or never) leaves the sentence above, which is true meanwhile.
    navigator.clipboard.writeText(text).then(() => { button.textContent = "Copied"; }, () => {});
  }
}

// Fetch an endpoint's attempts list again (an HTML fragment of this origin, behind the session's
// log-in), and its Send test event with it, until the test event waiting for its first attempt has
// had it; then stop.
async function refreshAttempts(list) {
  const started = Date.now();
  let pause = 500;
  while (list.hasAttribute("data-waiting") && Date.now() - started < 180000) {
    await new Promise(resolve => setTimeout(resolve, pause));
    pause = Math.min(pause * 1.5, 5000);
    let fresh, freshControl;
    try {
      const response = await fetch(list.dataset.refresh, {credentials: "same-origin", headers: {"Accept": "text/html"}});
      if (!response.ok) return;
      const html = new DOMParser().parseFromString(await response.text(), "text/html");
      fresh = html.getElementById(list.id);
      freshControl = html.getElementById(list.dataset.control);
    } catch {
      continue;  // offline for a moment: try again
    }
    if (!fresh) return;
    list.replaceChildren(...fresh.childNodes);
    list.toggleAttribute("data-waiting", fresh.hasAttribute("data-waiting"));
    // Send test event, or why not yet, comes after the list: offered again once the test is answered.
    const control = document.getElementById(list.dataset.control);
    if (control && freshControl) control.replaceWith(freshControl);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  for (const button of document.querySelectorAll("button[data-copies]")) {
    const source = document.getElementById(button.dataset.copies);
    button.addEventListener("click", () => copy(button, source));
    // Shown once it works: a button that does nothing until the script arrives is never clicked.
    button.hidden = false;
  }
  const tryIt = document.getElementById("try-secret");
  if (tryIt) {
    tryIt.addEventListener("click", () => {
      sessionStorage.setItem("playgroundKey", document.getElementById("new-secret").value);
    });
    // Offered once it hands the key on: before that, the playground would open without it.
    document.getElementById("try-secret-line").hidden = false;
  }
  for (const list of document.querySelectorAll(".attempts-list[data-waiting]")) {
    refreshAttempts(list);
  }
});
