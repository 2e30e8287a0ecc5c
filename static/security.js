// Copies the new secret, and hands it to the playground through this tab's sessionStorage.
document.addEventListener("DOMContentLoaded", () => {
  const button = document.getElementById("copy-secret");
  if (!button) return;
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
  document.getElementById("try-secret").addEventListener("click", () => {
    sessionStorage.setItem("playgroundKey", field.value);
  });
});
