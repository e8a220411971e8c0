"""The `vitpos` commands: options generated from typed settings (`options`), the per-experiment commands
(`experiments`), the tool commands (`tools`) and their printing (`printing`); `vitpos.cli` wires them."""
