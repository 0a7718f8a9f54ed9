"""After a run: what each step did, read back from its stored records, and the HTML run report.

:mod:`.records` gathers, for a set of steps, their status, versioned config, attempts
(from each output's ``attempts.json``), hours held and metrics; ``marinbuild show`` prints
them as a table and :mod:`.html` renders them as one self-contained HTML file.
"""
