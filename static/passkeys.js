// Passkeys: the browser's half of registration (Security tab), log-in (log-in page) and the second
// factor (log-in's second step). The server makes the options and keeps each challenge.
async function post(url, csrf, body) {
  const response = await fetch(url, {
    method: "POST",
    headers: {"Content-Type": "application/json", "Accept": "application/json", "X-CSRFToken": csrf},
    body: JSON.stringify(body || {}),
    credentials: "same-origin",
  });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error((answer.error && answer.error.message) || "The request failed.");
  return answer;
}

function showError(error) {
  const box = document.getElementById("passkey-error");
  // A ceremony the user cancelled (or that timed out) is a DOMException: say it plainly.
  box.textContent = error.name === "NotAllowedError" ? "The passkey request was cancelled or timed out." : error.message;
  box.hidden = false;
}

async function register(button) {
  const options = await post(button.dataset.options, button.dataset.csrf);
  const credential = await navigator.credentials.create({
    publicKey: PublicKeyCredential.parseCreationOptionsFromJSON(options),
  });
  await post(button.dataset.register, button.dataset.csrf, {
    name: document.getElementById("passkey-name").value,
    credential: JSON.stringify(credential.toJSON()),
  });
  window.location.reload();
}

async function authenticate(button) {
  const options = await post(button.dataset.options, button.dataset.csrf);
  const credential = await navigator.credentials.get({
    publicKey: PublicKeyCredential.parseRequestOptionsFromJSON(options),
  });
  const answer = await post(button.dataset.verify, button.dataset.csrf, {credential: JSON.stringify(credential.toJSON())});
  window.location.assign(answer.redirect);
}

document.addEventListener("DOMContentLoaded", () => {
  const actions = {"add-passkey": register, "passkey-login": authenticate, "passkey-second-factor": authenticate};
  for (const [id, action] of Object.entries(actions)) {
    const button = document.getElementById(id);
    if (!button) continue;
    if (!window.PublicKeyCredential || !PublicKeyCredential.parseCreationOptionsFromJSON) {
      button.title = "This browser does not support passkeys.";
      continue;
    }
    button.addEventListener("click", () => {
      button.disabled = true;
      action(button).catch(showError).finally(() => { button.disabled = false; });
    });
    // Enabled only now: a button clicked before this script arrived would do nothing.
    button.disabled = false;
  }
});
