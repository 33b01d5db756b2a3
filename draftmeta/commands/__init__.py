"""What each ``draftmeta`` command does, grouped by role; :mod:`draftmeta.cli` parses the command
line and calls them.

* :mod:`draftmeta.commands.terminal`: a command at the terminal: its progress line on stderr,
  vLLM's and torch's noise kept off it unless ``-v``, the one-line usage error (exit 2);
* :mod:`draftmeta.commands.inspection`: what ships and what it covers: ``explain``,
  ``coverage``;
* :mod:`draftmeta.commands.checks`: update against rebuild, exit 1 where it fails: ``verify``,
  ``audit``, ``infer``;
* :mod:`draftmeta.commands.measurement`: ``bench``, timed per draft step.

``draftmeta e2e`` is :mod:`draftmeta.integrations.vllm.tools.e2e.cli` (its parser and run
together), and ``infer``'s parser and run are
:mod:`draftmeta.integrations.vllm.tools.infer_cli`'s. Importing this package imports nothing
but the standard library: each command imports what it drives when it runs.
"""
