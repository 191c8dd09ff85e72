// Small DOM helpers shared by the modules that build HTML strings.

/** Text made safe to put inside HTML markup or a quoted attribute. @param {string} s */
export function escapeHtml(s) {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c] || c);
}
