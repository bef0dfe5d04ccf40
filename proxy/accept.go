package proxy

import "syscall"

// errTooManyFiles is the accept error that passes once descriptors free up.
var errTooManyFiles = syscall.EMFILE
