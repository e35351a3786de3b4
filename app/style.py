"""The page's static parts: its CSS, the scripts run on events, the introduction."""

CSS = """
/* contrast (WCAG AA): the default theme's subdued text, orange accent and red buttons are too light on white */
.gradio-container {--body-text-color-subdued: #4b5563; --color-accent: #c2410c; --color-accent-soft: #ffedd5;
  --button-primary-background-fill: #c2410c; --button-primary-background-fill-hover: #9a3412;
  --button-primary-text-color: #fff; --button-cancel-background-fill: #b91c1c;
  --button-cancel-background-fill-hover: #991b1b; --button-cancel-text-color: #fff; --link-text-color: #1d4ed8;
  --block-info-text-color: #4b5563}
.gradio-container .info-text, .gradio-container .info-text code {color: #374151}
.af-out {font-family: ui-serif, Georgia, serif; font-size: 1.08rem; line-height: 1.9; padding: 12px 14px;
         border: 1px solid #e5e7eb; border-radius: 10px; background: #fff; color: #111827; min-height: 64px;
         white-space: normal; overflow-wrap: anywhere; word-break: break-word; max-width: 100%}
.af-span {border-radius: 4px; padding: 1px 2px; margin: 0 1px; cursor: help; position: relative;
          text-underline-offset: 4px}
.af-span:focus-visible {outline: 2px solid #1d4ed8; outline-offset: 1px}
.af-span:focus::after {content: attr(data-tip); position: absolute; left: 0; top: 100%; z-index: 20;
          pointer-events: none; background: #111827; color: #fff; font: .8rem/1.4 ui-sans-serif, system-ui, sans-serif; padding: 4px 8px;
          border-radius: 6px; width: max-content; max-width: min(420px, 80vw); white-space: normal}
.af-sr {position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap}
.af-key {border-radius: 4px; padding: 1px 4px; text-underline-offset: 4px; color: #111827}
.af-legend {font-size: .85rem; color: #374151; margin-top: 6px}
.af-empty {color: #4b5563; padding: 10px}
.af-grid {display: grid; grid-template-columns: repeat(auto-fit, minmax(min(220px, 100%), 1fr)); gap: 12px}
.af-col {border: 1px solid #e5e7eb; border-radius: 10px; padding: 10px; background: #fafafa; color: #111827;
         min-width: 0}
.af-col pre {white-space: pre-wrap; overflow-wrap: anywhere; word-break: break-word; font-family: ui-serif, Georgia,
             serif; font-size: 1rem; margin: 6px 0 0}
.af-meta {font-size: .8rem; color: #4b5563}
#af-status {min-height: 1.5em}
/* the decision tree and token view inside Gradio's prose styles: plain lists, small left-aligned node buttons */
#af-tree ol, #af-tree ul {list-style: none; padding-left: 0; margin: 0}
#af-tree li::marker {content: none}
#af-tree li {margin: 0; padding-left: 0}
#af-tree button.af-node {font: inherit; font-size: .8rem; font-weight: 400; line-height: 1.35; text-align: left;
  color: #111827; background: #f9fafb; border: 1px solid #d1d5db; border-radius: 5px; padding: 4px 6px;
  display: block; width: 100%; min-height: 0; box-shadow: none}
#af-tree button.af-node:hover {background: #eef2ff}
#af-tree button.af-node.af-branch-point {box-shadow: inset 4px 0 0 #7c3aed}
#af-tree .af-label {font-weight: 600}
#af-tokens table {margin: 4px 0 10px}
/* a visible keyboard focus on every control (sliders, checkboxes, radios, tabs, tables, buttons) */
.gradio-container :is(button, input, textarea, select, [role=tab], [role=slider], [tabindex]):focus-visible,
.gradio-container label:focus-within:has(input[type=checkbox], input[type=radio]) {
  outline: 3px solid #1d4ed8 !important; outline-offset: 2px !important; box-shadow: 0 0 0 5px #bfdbfe !important}
.gradio-container input[type=range]:focus-visible {outline: 3px solid #1d4ed8 !important; outline-offset: 4px}
/* tables: headers wrap between words only, wide tables scroll sideways instead of cutting columns off */
.gradio-container table th, .gradio-container table th * {word-break: normal !important; overflow-wrap: normal !important;
  hyphens: none !important}
.gradio-container .table-wrap, .gradio-container .table-container {overflow-x: auto !important; max-width: 100%}
.af-example {border: 1px solid #c7d2fe; border-radius: 10px; padding: 8px 12px; background: #f8faff; color: #111827}
.af-example details p {max-height: 12em; overflow-y: auto; white-space: normal}
.af-notes {margin: 8px 0 0; padding-left: 1.2em}
.af-divergence {border-left: 4px solid #7c3aed; padding: 4px 10px; margin: 6px 0; background: #faf5ff}
"""

# Scroll the page to the status line and the answer under it when a decode starts (at 1280×800 they sit below
# the prompt and the examples)
TO_ANSWER = """() => { const el = document.getElementById('af-status');
  if (el) el.scrollIntoView({behavior: 'smooth', block: 'start'}); }"""
TO_VIEWS = """() => { const el = document.getElementById('af-example');
  if (el) el.scrollIntoView({behavior: 'smooth', block: 'start'}); }"""

# What the stop strings' handlers get as their last input: whether the user edited the stop box (SHORTCUTS listens)
STOP_EDITED = "(...args) => [...args.slice(0, -1), window.afStopEdited === true]"

# Keyboard shortcuts: Ctrl+Enter runs, Ctrl+Shift+Enter steps (also from inside the prompt box).
SHORTCUTS = """() => {
  if (window.afShortcuts) return;
  window.afShortcuts = true;
  document.addEventListener('keydown', (e) => {
    if (!(e.ctrlKey || e.metaKey) || e.key !== 'Enter') return;
    const id = e.shiftKey ? 'af-step' : 'af-run';
    const button = document.getElementById(id);
    if (!button || button.disabled) return;
    e.preventDefault();
    // a value typed into a slider's box is snapped when the box loses focus (app/sliders.py): leave it first
    if (document.activeElement && document.activeElement.matches('input[type=number]')) document.activeElement.blur();
    button.click();
  });
  // an edit of the stop box by the user (typed, deleted, pasted: every native input event; the page's own updates of
  // the box send none, and Gradio's input event misses deletions and pastes): the box is the user's from then on
  document.addEventListener('input', (e) => {
    if (e.isTrusted && e.target.closest && e.target.closest('#af-stop')) window.afStopEdited = true;
  }, true);
  // a decision-tree node that was not chosen: fill "Branch from round / with candidate", then branch
  document.addEventListener('click', (e) => {
    const node = e.target.closest && e.target.closest('#af-tree button[data-node]');
    if (!node) return;
    const [r, c] = node.dataset.node.split(':');
    const set = (id, v) => {
      const input = document.querySelector('#' + id + ' input');
      input.value = v;
      input.dispatchEvent(new Event('input', {bubbles: true}));
      input.dispatchEvent(new Event('change', {bubbles: true}));
    };
    set('af-branch-round', r);
    set('af-branch-cand', c);
    setTimeout(() => document.getElementById('af-branch').click(), 150);
  });
}"""

INTRO = """# AdaFuse Explorer
Several language models write **one answer together, word by word**. At each word start every model checks its
confidence margin Δ (top-1 minus top-2 probability): confident models **commit** up to M words, unsure ones
**explore** B distinct candidates; all candidates are scored by every model (length-normalized NLL) and the lowest
average wins. Hover a span (or Tab to it): its round, the runner-up and why it won. **Ctrl+Enter** runs,
**Ctrl+Shift+Enter** steps."""
