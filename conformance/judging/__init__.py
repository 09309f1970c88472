"""Judging: the step language run on an engine and on the spec in lockstep (driver), the properties, the
event checker and the judges (one group and hybrid), and the spec model they compare against."""
