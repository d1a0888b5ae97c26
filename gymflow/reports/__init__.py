"""What people read about a run: the terminal report, `gymflow show`, the HTML report and run comparisons.

Above the kernel: it reads the store through `gymflow.kernel.store.reports` and never writes.
"""
