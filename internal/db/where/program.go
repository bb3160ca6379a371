package where

import (
	"errors"
	"strconv"
)

// UnknownColumnError is returned by Bind for a column that the lookup
// function does not know.
type UnknownColumnError struct {
	Column string
}

func (e *UnknownColumnError) Error() string {
	return "where: unknown column " + strconv.Quote(e.Column)
}

// Program is an expression bound to a table's columns. It is immutable
// and safe for concurrent use.
//
// It is a decision graph: each node is one comparison with a successor
// for each outcome, and the exits are accept and reject. 'and', 'or' and
// 'not' only wire up successors, so evaluation costs one step per
// comparison it actually makes, with xapi's left-to-right short circuit.
type Program struct {
	start int // a node index, or accept or reject
	nodes []node
}

// Exits of the decision graph.
const (
	accept = -1
	reject = -2
)

type node struct {
	col, col2       int    // column indexes; col2 < 0 compares col with lit
	lit             string // the literal, when col2 < 0
	onTrue, onFalse int    // successors: node indexes, accept or reject
}

// Bind compiles e for a table whose columns lookup maps to the indexes
// that Program.Eval will pass to its get function.
//
// Constants and comparisons of two literals are decided here, so a column
// that evaluation can never reach, as in true or field "x" = "y", is not
// looked up (xapi never reads it either). Every other column must be
// known, or Bind returns an *UnknownColumnError. xapi is lazier: it only
// fails when some row reaches the column, so on an empty table, or when
// no row gets that far, it returns a result where Bind fails.
func Bind(e Expr, lookup func(column string) (int, bool)) (*Program, error) {
	var c compiler
	start := c.compile(e, accept, reject)
	if c.invalid {
		return nil, errors.New("where: Bind of an expression containing nil")
	}

	// Look up the columns of the nodes that evaluation can reach,
	// depth first from the start, so the first failure is usually the
	// leftmost unknown column.
	cols := map[string]int{}
	column := func(name string) (int, error) {
		if i, ok := cols[name]; ok {
			return i, nil
		}
		if lookup != nil {
			if i, ok := lookup(name); ok {
				cols[name] = i
				return i, nil
			}
		}
		return 0, &UnknownColumnError{Column: name}
	}
	seen := make([]bool, len(c.nodes))
	for stack := []int{start}; len(stack) > 0; {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if n < 0 || seen[n] {
			continue
		}
		seen[n] = true
		nd, names := &c.nodes[n], c.names[n]
		var err error
		if nd.col, err = column(names[0]); err != nil {
			return nil, err
		}
		if nd.col2 >= 0 {
			if nd.col2, err = column(names[1]); err != nil {
				return nil, err
			}
		}
		stack = append(stack, nd.onFalse, nd.onTrue)
	}

	// Bypass comparisons whose outcome does not matter, as in
	// field "x" = "y" or true. Successors come before their nodes in
	// c.nodes, so one pass in order sees every node's successors final.
	skip := func(n int) int {
		for n >= 0 && c.nodes[n].onTrue == c.nodes[n].onFalse {
			n = c.nodes[n].onTrue
		}
		return n
	}
	for i := range c.nodes {
		nd := &c.nodes[i]
		nd.onTrue, nd.onFalse = skip(nd.onTrue), skip(nd.onFalse)
	}
	return &Program{start: skip(start), nodes: c.nodes}, nil
}

// IsTrue reports whether p accepts every row without looking at it, so
// that evaluation can be skipped. This holds for true and for anything
// that folds to it, such as not false or "a" = "a".
func (p *Program) IsTrue() bool { return p.start == accept }

// Eval evaluates p on one row. get returns the value of the column with
// the given index, in xapi's stored string form.
func (p *Program) Eval(get func(col int) string) bool {
	n := p.start
	for n >= 0 {
		nd := &p.nodes[n]
		v := get(nd.col)
		var ok bool
		if nd.col2 < 0 {
			ok = v == nd.lit
		} else {
			ok = v == get(nd.col2)
		}
		if ok {
			n = nd.onTrue
		} else {
			n = nd.onFalse
		}
	}
	return n == accept
}

type compiler struct {
	nodes   []node
	names   [][2]string // column names of nodes[i], resolved by Bind
	invalid bool
}

// compile adds the nodes that decide e and returns the entry point: the
// first node, or ifTrue or ifFalse when e is constant.
func (c *compiler) compile(e Expr, ifTrue, ifFalse int) int {
	switch e := e.(type) {
	case True:
		return ifTrue
	case False:
		return ifFalse
	case Eq:
		l, r := e.L, e.R
		if l == r || !l.Field && !r.Field {
			if l == r {
				return ifTrue
			}
			return ifFalse
		}
		if !l.Field {
			l, r = r, l
		}
		nd := node{col2: -1, lit: r.Text, onTrue: ifTrue, onFalse: ifFalse}
		if r.Field {
			nd.col2, nd.lit = 0, ""
		}
		c.nodes = append(c.nodes, nd)
		c.names = append(c.names, [2]string{l.Text, r.Text})
		return len(c.nodes) - 1
	case Not:
		return c.compile(e.E, ifFalse, ifTrue)
	case And:
		return c.compile(e.L, c.compile(e.R, ifTrue, ifFalse), ifFalse)
	case Or:
		return c.compile(e.L, ifTrue, c.compile(e.R, ifTrue, ifFalse))
	}
	c.invalid = true
	return ifFalse
}
