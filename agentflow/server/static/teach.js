/* "Save as example": teach the database an answer's question and (corrected) SQL.
 *
 * Listens for the answers app.js shows (the "agentflow:answer" event) and POSTs the pair to
 * /v1/databases/{db}/examples. The server checks the SQL (read-only guard, runs on the
 * database) and says why when it refuses; nothing here decides what is valid. */
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  let current = null;  // the answer on screen: {question, sql, db}

  function reset() {
    $("teach-form").hidden = true;
    $("teach-error").hidden = true;
    $("teach-note").textContent = "";
    $("teach-note").className = "teach-note";
  }

  document.addEventListener("agentflow:answer", (e) => {
    const q = e.detail;
    current = q && q.db && q.question ? { question: q.question, sql: q.sql || "", db: q.db }
      : null;
    reset();
    // Any finished answer can be taught: a wrong or failed one is where a correction helps.
    $("teach-bar").hidden = !(current && ["done", "unsure", "failed"].indexOf(q.status) >= 0);
  });

  $("teach-button").addEventListener("click", () => {
    if (!current) return;
    $("teach-question").value = current.question;
    $("teach-sql").value = current.sql;
    $("teach-form").hidden = false;
    $("teach-error").hidden = true;
    $("teach-sql").focus();
  });
  $("teach-cancel").addEventListener("click", reset);

  $("teach-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    if (!current) return;
    const body = { question: $("teach-question").value.trim(), sql: $("teach-sql").value.trim() };
    const err = $("teach-error");
    if (!body.question || !body.sql) {
      err.hidden = false;
      err.textContent = "Both the question and the SQL are needed.";
      return;
    }
    $("teach-save").disabled = true;
    try {
      const http = window.agentflowApi;
      const saved = await http.readJson(await http.api(
        "/v1/databases/" + encodeURIComponent(current.db) + "/examples",
        { method: "POST", body: JSON.stringify(body) }));
      $("teach-form").hidden = true;
      $("teach-note").className = "teach-note ok";
      $("teach-note").textContent = "Saved as example #" + saved.id + " for " + saved.db +
        ": similar questions get it from now on.";
    } catch (ex) {
      err.hidden = false;
      err.textContent = ex.message;
    } finally {
      $("teach-save").disabled = false;
    }
  });
})();
