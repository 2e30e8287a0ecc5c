// Calls the REST endpoints and opens both sockets from the browser, showing what comes back.
document.addEventListener("DOMContentLoaded", () => {
  const $ = (id) => document.getElementById(id);
  const keyField = $("api-key");
  const socketBase = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/api/v1/ws`;
  // A key typed or pasted before this script arrived is the one to use.
  if (!keyField.value) keyField.value = sessionStorage.getItem("playgroundKey") || "";
  keyField.addEventListener("change", () => sessionStorage.setItem("playgroundKey", keyField.value.trim()));

  for (const button of document.querySelectorAll("button.call")) {
    button.addEventListener("click", async () => {
      const headers = button.dataset.protected ? { "X-API-Key": keyField.value.trim() } : {};
      const response = await fetch(button.dataset.path, { headers, credentials: "omit" });
      const text = await response.text();
      $("rest-status").textContent = `${response.status} ${response.statusText}`;
      $("rest-headers").textContent = [...response.headers].map(([name, value]) => `${name}: ${value}`).join("\n");
      try {
        $("rest-body").textContent = JSON.stringify(JSON.parse(text), null, 2);
      } catch {
        $("rest-body").textContent = text;
      }
      $("rest-result").hidden = false;
    });
  }

  let timeSocket = null;
  $("time-open").addEventListener("click", () => {
    const socket = new WebSocket(`${socketBase}/time?api_key=${encodeURIComponent(keyField.value.trim())}`);
    let accepted = false;
    timeSocket = socket;
    $("clock").textContent = "--:--:--";
    $("time-state").textContent = "Connecting...";
    $("time-open").disabled = true;
    $("time-close").disabled = false;
    socket.addEventListener("message", (event) => {
      const message = JSON.parse(event.data);
      if (message.type === "auth_success") {
        accepted = true;
        $("time-state").textContent = `Connected with key “${message.api_key_name}”.`;
      } else if (message.type === "time_update") {
        $("clock").textContent = message.formatted;
        $("clock").dataset.timestamp = message.timestamp;
      }
    });
    socket.addEventListener("close", (event) => {
      // A refused handshake never opens: the browser reports only an error and close code 1006.
      $("time-state").textContent = accepted
        ? `Closed (code ${event.code}${event.reason ? `: ${event.reason}` : ""}).`
        : "Refused: the server did not accept this key (missing, invalid, revoked or over its limit).";
      $("time-state").className = accepted ? "" : "refused";
      if (!accepted) $("clock").textContent = "--:--:--";
      $("time-open").disabled = false;
      $("time-close").disabled = true;
    });
  });
  $("time-close").addEventListener("click", () => timeSocket && timeSocket.close(1000));

  let echoSocket = null;
  function openEcho() {
    echoSocket = new WebSocket(`${socketBase}/echo`);
    echoSocket.addEventListener("open", () => { $("echo-state").textContent = "Connected."; });
    echoSocket.addEventListener("close", (event) => {
      $("echo-state").textContent = `Closed (code ${event.code}).`;
      echoSocket = null;
    });
    echoSocket.addEventListener("message", (event) => {
      const message = JSON.parse(event.data);
      const item = document.createElement("li");
      item.textContent = `${message.server_time}: ${message.message}`;
      // Newest first, so each reply keeps the number it arrived with.
      item.value = $("echo-log").children.length + 1;
      $("echo-log").prepend(item);
    });
    return echoSocket;
  }
  $("echo-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("echo-message").value;
    const socket = echoSocket || openEcho();
    if (socket.readyState === WebSocket.OPEN) {
      socket.send(text);
    } else {
      socket.addEventListener("open", () => socket.send(text), { once: true });
    }
    $("echo-message").value = "";
  });

  // Enabled only now: a control clicked before this script arrived would do nothing.
  for (const control of document.querySelectorAll("button.call, #time-open, #echo-form button")) {
    control.disabled = false;
  }
});
