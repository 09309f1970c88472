"""Running: the vectors runner, the stateful Hypothesis runner, the suite that makes one report, and
engines in other processes (subprocess adapter, JSON-lines server, process lifetime, supervision)."""
