"""The language: `.sop` text to a typed IR with source spans, diagnostics, the compiled graph, pictures
and JSON Schemas. Nothing here evaluates a program; that is `sopgraph.logic`."""
