#version 330
// an include may not declare a version
