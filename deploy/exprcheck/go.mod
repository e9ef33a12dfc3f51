module github.com/infersight/infersight/deploy/exprcheck

go 1.22

require github.com/expr-lang/expr v1.17.8
