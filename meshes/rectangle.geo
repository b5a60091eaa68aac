// Parameter domain, p = 2: the rectangle [-2, 2] x [-2, 2] with a structured, right-angled
// triangulation (non-obtuse, so the P1 stiffness matrix is an M-matrix). Measure 16.
Point(1) = {-2, -2, 0};
Point(2) = {2, -2, 0};
Point(3) = {2, 2, 0};
Point(4) = {-2, 2, 0};
Line(1) = {1, 2};
Line(2) = {2, 3};
Line(3) = {3, 4};
Line(4) = {4, 1};
Curve Loop(1) = {1, 2, 3, 4};
Plane Surface(1) = {1};
Transfinite Curve{1, 2, 3, 4} = 33;
Transfinite Surface{1};
Physical Curve("boundary", 1) = {1, 2, 3, 4};
Physical Surface("theta", 1) = {1};
