package main

// version is the program's version, reported by session/initialize.
const version = "0.1.0"
