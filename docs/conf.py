"""Sphinx configuration for the ketten documentation."""

from __future__ import annotations

from typing import TYPE_CHECKING

import ketten

if TYPE_CHECKING:
    from sphinx.application import Sphinx

project = "ketten"
author = "the ketten authors"
copyright = "the ketten authors"
version = release = ketten.__version__

extensions = ["sphinx.ext.autodoc"]

root_doc = "index"
exclude_patterns = ["_build"]
nitpicky = False

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {
    "members": True,
    "undoc-members": True,
    "show-inheritance": True,
}

html_theme = "alabaster"
html_title = f"ketten {release}"
html_theme_options = {
    "description": "signed, replicated event chains for trio programs",
    "fixed_sidebar": True,
}


def _plugin_option_rows() -> list[str]:
    """A list-table of the options every built-in plugin declares (ketten_plugin_spec)."""
    kinds = ("transport", "overlay", "store", "clock", "delivery")
    found = []
    for _, plugin in ketten.plugin_manager().list_name_plugin():
        if not getattr(plugin, "__name__", "").startswith("ketten."):
            continue
        for kind, names in plugin.ketten_plugin_names().items():
            for name in names:
                found.append((kinds.index(kind), name, kind,
                              plugin.ketten_plugin_spec(kind=kind, name=name)))
    rows = [".. list-table::", "   :header-rows: 1", "   :widths: 14 22 18 46", "",
            "   * - plugin", "     - option", "     - type", "     - meaning"]
    for _, name, kind, spec in sorted(found, key=lambda item: item[:2]):
        options = list(spec.options.items()) if spec is not None else []
        if spec is not None and spec.clocks:
            needs = " or ".join(f"``{clock}``" for clock in spec.clocks)
            options.append(("", ketten.Option(f"needs the {needs} clock on every node")))
        if not options:
            options = [("", ketten.Option("takes no options"))]
        for index, (option, declared) in enumerate(options):
            label = f"{kind} ``{name}``" if index == 0 else ""
            types = " or ".join(t.__name__ for t in declared.types) if option else ""
            rows += [f"   * - {label}", f"     - ``{option}``" if option else "     -",
                     f"     - {types}", f"     - {declared.doc}"]
    return rows


def setup(app: Sphinx) -> dict[str, bool]:
    from docutils import nodes
    from docutils.statemachine import StringList
    from sphinx.util.docutils import SphinxDirective

    class PluginOptions(SphinxDirective):
        """``.. ketten-plugin-options::``: the table of :func:`_plugin_option_rows`."""

        def run(self) -> list[nodes.Node]:
            container = nodes.container()
            self.state.nested_parse(StringList(_plugin_option_rows(), "<plugin options>"),
                                    self.content_offset, container)
            return list(container.children)

    app.add_directive("ketten-plugin-options", PluginOptions)
    return {"parallel_read_safe": True}
