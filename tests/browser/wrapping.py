"""Where a page's text wraps: a line may end only between words, never inside one."""

# Every text node of the page's main part, outside form controls and code, read character by character: where the
# next character starts a new line and both it and the one before are letters or digits, a word was broken.
_BROKEN_WORDS = """() => {
  const broken = [], word = /[\\p{L}\\p{N}]/u;
  const walker = document.createTreeWalker(document.querySelector("main"), NodeFilter.SHOW_TEXT, {
    acceptNode: node => node.parentElement.closest("select, textarea, script, style, code, pre, .visually-hidden")
      ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT});
  const range = document.createRange();
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const text = node.textContent;
    let before = null;
    for (let i = 0; i < text.length; i++) {
      range.setStart(node, i);
      range.setEnd(node, i + 1);
      const box = range.getBoundingClientRect();
      if (!box.width && !box.height) { before = null; continue; }
      if (before && box.top >= before.bottom - 1 && word.test(text[i]) && word.test(text[i - 1]))
        broken.push(`${text.slice(Math.max(0, i - 12), i)}|${text.slice(i, i + 12)}`);
      before = box;
    }
  }
  return broken;
}"""


def broken_words(page) -> list[str]:
    """Each word the page's main part breaks across two lines, as 'before|after' around the break."""
    return page.evaluate(_BROKEN_WORDS)
