"""minigen: a miniature inference engine used to demonstrate alloc-audit."""
