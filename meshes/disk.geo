// Token domain, d = 2: the disk of radius 3 about the origin. Measure 9 pi (to O(h^2) for the polygon).
SetFactory("OpenCASCADE");
Disk(1) = {0, 0, 0, 3.0};
MeshSize{ PointsOf{ Surface{1}; } } = 0.2;
Mesh.MeshSizeMin = 0.2;
Mesh.MeshSizeMax = 0.2;
Physical Curve("boundary", 1) = {1};
Physical Surface("omega", 1) = {1};
