"""Tasks: seed operators, composition, execution filter, decontamination, task sets and evaluation metrics.

Pipeline (``kernelrl tasks synthesize``): seeds.catalog() -> compose.compose() -> render.render()
-> decontam.Decontaminator -> filter_runner.filter_sources() (filter.check_task in sandboxed
children) -> dataset.write_task()/write_index(). ``kernelrl eval`` reads a task set with
dataset.load_tasks(), evaluates solutions (evaluate.py) and reports metrics.py's numbers.
The built-in set lives in ``builtin/`` (index.json + <backend>/level<N>/*.py).
"""
