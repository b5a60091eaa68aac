// Token domain, d = 1: the interval [-4, 4] with 200 cells. Measure 8.
Point(1) = {-4, 0, 0, 0.04};
Point(2) = {4, 0, 0, 0.04};
Line(1) = {1, 2};
Transfinite Curve{1} = 201;
Physical Point("left", 1) = {1};
Physical Point("right", 2) = {2};
Physical Curve("omega", 1) = {1};
