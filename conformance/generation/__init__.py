"""Generation: the operation families and configs a run draws, the vector scenarios (tables walked by
one player), the vector file format, the seeding probe and the minimizer of a failing sequence."""
