// Small DOM helpers shared by the modules that build HTML strings.

/** Text made safe to put inside HTML markup or a quoted attribute. @param {string} s */
/**
 * Colour the swatches of `root` from their `data-color`: HTML strings carry the colour as data,
 * and it is set through the CSSOM, which the page's CSP (style-src 'self', no inline style
 * attributes) allows. @param {ParentNode} root
 */
export function paintSwatches(root) {
  root.querySelectorAll("[data-color]").forEach((el) => {
    /** @type {HTMLElement} */ (el).style.background = /** @type {HTMLElement} */ (el).dataset.color || "";
  });
}

export function escapeHtml(s) {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c] || c);
}
