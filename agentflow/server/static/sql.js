/* A small SQL highlighter (no dependencies, nothing loaded from the internet).
 *
 * Tokenizes with one regular expression, wraps keywords, functions, strings, numbers,
 * comments and quoted identifiers in spans, and breaks long one-line queries before their
 * main clauses so they read top to bottom. It builds DOM nodes whose text is set with
 * textContent, never HTML strings: SQL written by a model is untrusted text. */
(function (global) {
  "use strict";
  const KEYWORDS = new Set((
    "select from where and or not in is null like between exists case when then else end " +
    "as on join inner left right full outer cross natural using group by order having " +
    "limit offset union all intersect except distinct asc desc with recursive cast " +
    "collate escape glob values true false over partition window filter rows range " +
    "preceding following current row nulls first last interval date time timestamp"
  ).split(" "));
  const CLAUSES = new Set(["from", "where", "group", "order", "having", "limit", "union",
    "intersect", "except", "join", "left", "right", "inner", "full", "cross"]);
  const TOKEN = /(--[^\n]*|\/\*[\s\S]*?\*\/)|('(?:[^']|'')*'?)|("(?:[^"]|"")*"?|`[^`]*`?|\[[^\]]*\]?)|(\b\d+(?:\.\d+)?(?:e[+-]?\d+)?\b)|([A-Za-z_][A-Za-z0-9_$]*)|(\s+)|([\s\S])/gi;

  /* For callers that must build markup: escapes all five characters that matter in
   * element content and in quoted attribute values. */
  function escapeHtml(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
  }

  function span(cls, text) {
    const node = document.createElement("span");
    node.className = cls;
    node.textContent = text;
    return node;
  }

  /* A DocumentFragment of the highlighted SQL. */
  function highlight(sql) {
    const tokens = [];
    let m;
    TOKEN.lastIndex = 0;
    while ((m = TOKEN.exec(sql)) !== null) {
      if (m[1]) tokens.push(["comment", m[1]]);
      else if (m[2]) tokens.push(["string", m[2]]);
      else if (m[3]) tokens.push(["ident", m[3]]);
      else if (m[4]) tokens.push(["number", m[4]]);
      else if (m[5]) tokens.push(["word", m[5]]);
      else if (m[6]) tokens.push(["space", m[6]]);
      else tokens.push(["punct", m[7]]);
    }
    const multiline = sql.indexOf("\n") >= 0;
    const breakLines = !multiline && sql.length > 70;
    let depth = 0;
    let prevWord = "";
    const out = document.createDocumentFragment();
    tokens.forEach(([kind, text], i) => {
      if (kind === "punct") {
        if (text === "(") depth++;
        if (text === ")") depth = Math.max(0, depth - 1);
        out.append(span("sql-punct", text));
        return;
      }
      if (kind === "space") {
        const next = tokens[i + 1];
        const nextWord = next && next[0] === "word" ? next[1].toLowerCase() : "";
        const joinAfterModifier = nextWord === "join" &&
          ["left", "right", "inner", "full", "cross", "outer", "natural"].indexOf(prevWord) >= 0;
        if (breakLines && depth === 0 && CLAUSES.has(nextWord) && !joinAfterModifier) {
          out.append("\n");
        } else {
          out.append(text);
        }
        return;
      }
      if (kind === "word") {
        const lower = text.toLowerCase();
        prevWord = lower;
        let next = tokens[i + 1];
        if (next && next[0] === "space") next = tokens[i + 2];
        if (KEYWORDS.has(lower)) {
          out.append(span("sql-kw", text));
        } else if (next && next[1] === "(") {
          out.append(span("sql-fn", text));
        } else {
          out.append(span("sql-id", text));
        }
        return;
      }
      out.append(span("sql-" + kind, text));
    });
    return out;
  }

  global.SqlHighlight = { highlight: highlight, escapeHtml: escapeHtml };
})(window);
