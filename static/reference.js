// The API reference's folds (templates/docs.html): every section, and each operation, socket, event
// and schema in it, is a <details> closed in the HTML, so that a phone loads a short page. This
// script opens them all on a wide screen, and opens the folds that hold a link's target before the
// browser scrolls to it: the contents, a schema's link and a shared address reach a folded part.
// Without it the page works as plain HTML: each summary opens its fold.

const WIDE = "(min-width: 64rem)";

// The element a link's "#anchor" names, or null.
function target(hash) {
  if (!hash || hash.length < 2) {
    return null;
  }
  try {
    return document.getElementById(decodeURIComponent(hash.slice(1)));
  } catch {
    return null;  // a malformed escape in an address typed by hand
  }
}

// Open every fold that holds the element, and its own: the one it is, heads, or wraps first.
function unfold(element) {
  const own = element.matches("details") ? element : element.querySelector(":scope > details");
  if (own) {
    own.open = true;
  }
  for (let fold = element.closest("details"); fold; fold = fold.parentElement.closest("details")) {
    fold.open = true;
  }
}

function unfoldAddress() {
  const named = target(location.hash);
  if (named) {
    unfold(named);
    named.scrollIntoView();
  }
}

if (window.matchMedia(WIDE).matches) {
  for (const fold of document.querySelectorAll("details.fold")) {
    fold.open = true;
  }
}
// A click on a link runs before the browser follows it, which then scrolls to an open part.
document.addEventListener("click", (event) => {
  const link = event.target.closest('a[href^="#"]');
  const named = link && target(link.getAttribute("href"));
  if (named) {
    unfold(named);
  }
});
// Back, forward, or an address given with its anchor.
window.addEventListener("hashchange", unfoldAddress);
unfoldAddress();
