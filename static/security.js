// Copies a secret shown once (a new key's, a webhook endpoint's), and hands a new key to the
// playground through this tab's sessionStorage.
document.addEventListener("DOMContentLoaded", () => {
  for (const button of document.querySelectorAll("button[data-copies]")) {
    const field = document.getElementById(button.dataset.copies);
    button.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(field.value);
      } catch {
        field.select();
        document.execCommand("copy");
      }
      button.textContent = "Copied";
    });
  }
  const tryIt = document.getElementById("try-secret");
  if (tryIt) {
    tryIt.addEventListener("click", () => {
      sessionStorage.setItem("playgroundKey", document.getElementById("new-secret").value);
    });
  }
});
