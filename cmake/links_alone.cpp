// cmake/links_alone.cpp: the program each library layer is linked into with only the layers below
// it (cmake/layers.cmake). It runs nothing; the check is that the link succeeds.
int main() { return 0; }
