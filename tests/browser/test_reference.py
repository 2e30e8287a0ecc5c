"""The API reference (/docs) in headless Chromium against the real server: at 390 px it loads folded,
under 15,000 px tall, and each link of its contents opens the part it names (and stays under 15,000
px); at 1280 px it loads open; without a script it still loads folded and every fold opens from the
keyboard; axe-core finds nothing folded or open, and opened at 390 px nothing is wider than the
phone and every path wraps only at a slash."""

from pprint import pformat

import pytest
from browsing import DESKTOP, PATH_BROKEN, PATHS, PHONE, TOO_WIDE, axe_violations, painted

try:
    from playwright.sync_api import expect
except ImportError:
    pass

TALLEST = 15_000
HEIGHT = "document.documentElement.scrollHeight"
# Whether every fold that holds the element is open, and its own fold too: the one it is, heads
# (in its summary) or wraps as its first child.
UNFOLDED = """element => {
  const own = element.matches('details') ? element
    : element.closest('summary') ? element.closest('details') : element.querySelector(':scope > details');
  const holders = [];
  for (let fold = element.parentElement.closest('details'); fold; fold = fold.parentElement.closest('details'))
    holders.push(fold);
  return (!own || own.open) && holders.every(fold => fold.open);
}"""
FOLD_ALL = "() => { for (const fold of document.querySelectorAll('details')) fold.open = false; scrollTo(0, 0); }"
# Open every fold; return how many were closed.
OPEN_ALL = """() => {
  const closed = [...document.querySelectorAll('details')].filter(fold => !fold.open);
  for (const fold of closed) fold.open = true;
  return closed.length;
}"""


def contents(page):
    """The href of every link of the page's contents, in order."""
    return page.get_by_role("navigation", name="On this page").get_by_role("link").evaluate_all(
        "links => links.map(link => link.getAttribute('href'))")


def test_at_390_px_it_loads_folded_under_15000_px_and_each_link_of_its_contents_opens_its_part(open_page):
    page = open_page(PHONE)
    page.goto("/docs")
    painted(page)
    assert page.evaluate(HEIGHT) < TALLEST
    links = contents(page)
    # Every section, operation, socket and event, and the webhooks' parts.
    named = page.locator("main section, main article[id]").evaluate_all(
        "parts => parts.map(part => '#' + (part.id || part.getAttribute('aria-labelledby')))")
    assert set(named) < set(links) and len(links) == len(set(links))
    found = []
    for href in links:
        page.evaluate(FOLD_ALL)  # as loaded on a phone
        page.get_by_role("navigation", name="On this page").locator(f'a[href="{href}"]').click()
        target = page.locator(f'[id="{href[1:]}"]')
        expect(target).to_be_in_viewport()
        if not target.evaluate(UNFOLDED):
            found.append(f"{href} is not unfolded")
        if (height := page.evaluate(HEIGHT)) >= TALLEST:
            found.append(f"{href} makes the page {height} px tall")
    assert not found, pformat(found, width=120)


def test_a_link_from_inside_a_part_opens_the_part_it_names(open_page):
    page = open_page(PHONE)
    page.goto("/docs#protected_test")
    article = page.locator("#protected_test")
    expect(article).to_be_in_viewport()
    assert article.evaluate(UNFOLDED)
    schema = article.locator("table.responses a[href^='#schema-']").first
    name = schema.get_attribute("href")
    schema.click()
    expect(page.locator(name)).to_be_in_viewport()
    assert page.locator(name).evaluate(UNFOLDED)
    page.go_back()  # the history's hash: open as it was
    expect(article).to_be_in_viewport()


def test_at_1280_px_it_loads_open_and_its_contents_reach_each_part(open_page, screenshots):
    page = open_page(DESKTOP)
    page.goto("/docs")
    painted(page)
    assert page.locator("details:not([open])").count() == 0
    for href in contents(page):
        page.get_by_role("navigation", name="On this page").locator(f'a[href="{href}"]').click()
        expect(page.locator(f'[id="{href[1:]}"]')).to_be_in_viewport()
    page.evaluate("scrollTo(0, 0)")
    page.screenshot(path=screenshots / "api-reference.png", full_page=False)


def test_without_a_script_it_loads_folded_and_each_fold_opens_from_the_keyboard(browser, server, screenshots):
    context = browser.new_context(base_url=server.base, viewport=PHONE, java_script_enabled=False)
    try:
        page = context.new_page()
        page.goto("/docs")
        page.wait_for_load_state("load")
        # No script runs in the page: its height is the root's box, measured from outside.
        assert page.locator("html").bounding_box()["height"] < TALLEST
        page.screenshot(path=screenshots / "phone-api-reference.png", full_page=True)
        folds = page.locator("main details")
        assert folds.count() > 40 and page.locator("main details[open]").count() == 0
        section = page.locator("section[aria-labelledby='tag-keyed'] > details")
        summary = section.locator(":scope > summary")
        # A summary takes the focus as a button does: Enter and Space open and close its fold.
        summary.focus()
        expect(summary).to_be_focused()
        page.keyboard.press("Enter")
        expect(section).to_have_attribute("open", "")
        operation = section.locator("article.operation > details").first
        page.keyboard.press("Tab")
        expect(operation.locator(":scope > summary")).to_be_focused()
        page.keyboard.press("Space")
        expect(operation).to_have_attribute("open", "")
        expect(operation.locator("table.responses")).to_be_visible()
        page.keyboard.press("Shift+Tab")
        page.keyboard.press("Space")
        expect(section).not_to_have_attribute("open", "")
    finally:
        context.close()


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390px", "1280px"])
def test_axe_finds_nothing_folded_or_open_and_opened_on_a_phone_it_fits(open_page, viewport):
    page = open_page(viewport)
    page.goto("/docs")
    painted(page)
    found = {"as loaded": axe_violations(page)}
    # At 1280 px it loads open: with no fold to open, the page is the one axe-core just looked at.
    found["every fold open"] = axe_violations(page) if page.evaluate(OPEN_ALL) else found["as loaded"]
    if viewport == PHONE:
        found["wider than the phone"] = page.evaluate(TOO_WIDE)
        found["paths broken"] = page.evaluate(PATH_BROKEN, PATHS)
    found = {state: problems for state, problems in found.items() if problems}
    assert not found, pformat(found, width=120)
