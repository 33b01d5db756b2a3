"""What every benchmark of draftmeta measures the same way, below ``draftmeta bench`` and
``draftmeta e2e`` alike, which import it and nothing of each other:

* ``noise``: the noise rule: pair ratios, the A/A control, one verdict;
* ``machine``: the machine's load while a benchmark runs;
* ``plots``: the size and fonts every committed plot is drawn at.
"""
