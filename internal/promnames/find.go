/*
Copyright 2026 The Synapse Fleet Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

// Package promnames finds, in the Go source, every Prometheus metric the project defines and
// the labels it carries, so that dashboards and alerting rules are checked against what the
// binaries export rather than against what someone remembers them exporting.
//
// It reads the metrics where client_golang builds them: the Opts literal of each
// prometheus.New{Counter,Gauge,Histogram,Summary}[Vec] call with the Vec's label names, and
// each prometheus.NewDesc of a hand-written collector, whose name and labels may come through
// the parameters of a small helper (`d := func(name, help string, labels ...string)`): the
// helper's calls are read for them.
package promnames

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/tools/go/packages"
)

const promPkg = "github.com/prometheus/client_golang/prometheus"

// Type is what a metric is, which decides the series it exports.
type Type string

const (
	Counter   Type = "counter"
	Gauge     Type = "gauge"
	Histogram Type = "histogram"
	Summary   Type = "summary"
	// Untyped is a collector's Desc, whose type is decided when it is collected.
	Untyped Type = "untyped"
)

// Metric is one metric family.
type Metric struct {
	Name   string
	Type   Type
	Labels []string
	// At is the file (relative to the module) and line that defines it.
	At string
}

// Series are the series names the family exports, each with the labels it carries beyond the
// family's: a histogram's _bucket (le), _sum and _count, a summary's quantiles, _sum and _count.
func (m Metric) Series() map[string][]string {
	switch m.Type {
	case Histogram:
		return map[string][]string{m.Name + "_bucket": {"le"}, m.Name + "_sum": nil, m.Name + "_count": nil}
	case Summary:
		return map[string][]string{m.Name: {"quantile"}, m.Name + "_sum": nil, m.Name + "_count": nil}
	}
	return map[string][]string{m.Name: nil}
}

// Find loads the packages matching patterns in the module at dir, without their tests, and
// returns every metric they define. A definition whose name or labels it cannot read to
// constants is an error: the check it serves would otherwise pass by not looking.
func Find(dir string, patterns ...string) ([]Metric, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	cfg := &packages.Config{Dir: dir, Env: os.Environ(),
		Mode: packages.NeedName | packages.NeedFiles | packages.NeedSyntax | packages.NeedTypes | packages.NeedTypesInfo}
	pkgs, err := packages.Load(cfg, patterns...)
	if err != nil {
		return nil, fmt.Errorf("loading %v: %w", patterns, err)
	}
	var out []Metric
	var errs []string
	for _, p := range pkgs {
		for _, e := range p.Errors {
			errs = append(errs, e.Error())
		}
		for _, file := range p.Syntax {
			ms, err := inFile(dir, p, file)
			if err != nil {
				errs = append(errs, err.Error())
			}
			out = append(out, ms...)
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("reading metrics: %s", strings.Join(errs, "; "))
	}
	slices.SortFunc(out, func(a, b Metric) int { return strings.Compare(a.Name+a.At, b.Name+b.At) })
	return out, nil
}

// env maps a helper's parameters to the expressions its call passed (a variadic one to the
// rest of the arguments).
type env map[types.Object][]ast.Expr

func inFile(dir string, p *packages.Package, file *ast.File) ([]Metric, error) {
	info := p.TypesInfo
	rel, err := filepath.Rel(dir, p.Fset.Position(file.Pos()).Filename)
	if err != nil {
		return nil, err
	}
	at := func(n ast.Node) string {
		return fmt.Sprintf("%s:%d", filepath.ToSlash(rel), p.Fset.Position(n.Pos()).Line)
	}
	// The function literals assigned to a variable, and the calls of each such variable.
	helpers := map[types.Object]*ast.FuncLit{}
	calls := map[types.Object][]*ast.CallExpr{}
	ast.Inspect(file, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			for i, rhs := range n.Rhs {
				if lit, ok := rhs.(*ast.FuncLit); ok && i < len(n.Lhs) {
					if id, ok := n.Lhs[i].(*ast.Ident); ok {
						if obj := info.ObjectOf(id); obj != nil {
							helpers[obj] = lit
						}
					}
				}
			}
		case *ast.CallExpr:
			if id, ok := n.Fun.(*ast.Ident); ok {
				if obj := info.Uses[id]; obj != nil {
					calls[obj] = append(calls[obj], n)
				}
			}
		}
		return true
	})
	var out []Metric
	var errs []string
	ast.Inspect(file, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		fn := promFunc(info, call)
		switch {
		case fn == "NewDesc":
			envs := []env{nil}
			if obj, lit := enclosingHelper(helpers, call); lit != nil {
				envs = nil
				for _, c := range calls[obj] {
					envs = append(envs, bind(info, lit, c))
				}
			}
			for _, e := range envs {
				names, ok1 := strs(info, e, call.Args[0])
				labels, ok2 := strList(info, e, call.Args[2])
				if !ok1 || !ok2 || len(names) != 1 {
					errs = append(errs, fmt.Sprintf("%s: a Desc whose name or labels are not constants", at(call)))
					continue
				}
				out = append(out, Metric{Name: names[0], Type: Untyped, Labels: labels, At: at(call)})
			}
		case strings.HasPrefix(fn, "New") && optsType(fn) != "":
			m, err := fromOpts(info, call, fn)
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", at(call), err))
				return true
			}
			m.At = at(call)
			out = append(out, m)
		}
		return true
	})
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return out, nil
}

// promFunc is the name of the client_golang prometheus function call calls, or "".
func promFunc(info *types.Info, call *ast.CallExpr) string {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return ""
	}
	fn, ok := info.Uses[sel.Sel].(*types.Func)
	if !ok || fn.Pkg() == nil || fn.Pkg().Path() != promPkg {
		return ""
	}
	return fn.Name()
}

// optsType is the metric type a constructor builds, or "" for other functions.
func optsType(fn string) Type {
	switch strings.TrimSuffix(strings.TrimPrefix(fn, "New"), "Vec") {
	case "Counter":
		return Counter
	case "Gauge":
		return Gauge
	case "Histogram":
		return Histogram
	case "Summary":
		return Summary
	}
	return ""
}

func fromOpts(info *types.Info, call *ast.CallExpr, fn string) (Metric, error) {
	m := Metric{Type: optsType(fn)}
	if len(call.Args) == 0 {
		return m, fmt.Errorf("%s without options", fn)
	}
	opts := ast.Unparen(call.Args[0])
	if u, ok := opts.(*ast.UnaryExpr); ok {
		opts = u.X
	}
	lit, ok := opts.(*ast.CompositeLit)
	if !ok {
		return m, fmt.Errorf("%s's options are not a literal", fn)
	}
	parts := map[string]string{}
	for _, elt := range lit.Elts {
		kv, ok := elt.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		key, _ := kv.Key.(*ast.Ident)
		if key == nil || (key.Name != "Namespace" && key.Name != "Subsystem" && key.Name != "Name") {
			continue
		}
		v, ok := constString(info, kv.Value)
		if !ok {
			return m, fmt.Errorf("%s's %s is not a constant", fn, key.Name)
		}
		parts[key.Name] = v
	}
	var name []string
	for _, k := range []string{"Namespace", "Subsystem", "Name"} {
		if parts[k] != "" {
			name = append(name, parts[k])
		}
	}
	m.Name = strings.Join(name, "_")
	if m.Name == "" {
		return m, fmt.Errorf("%s without a name", fn)
	}
	if strings.HasSuffix(fn, "Vec") {
		if len(call.Args) < 2 {
			return m, fmt.Errorf("%s without labels", fn)
		}
		labels, ok := strList(info, nil, call.Args[1])
		if !ok {
			return m, fmt.Errorf("%s's labels are not constants", fn)
		}
		m.Labels = labels
	}
	return m, nil
}

func constString(info *types.Info, e ast.Expr) (string, bool) {
	tv, ok := info.Types[e]
	if !ok || tv.Value == nil || tv.Value.Kind() != constant.String {
		return "", false
	}
	return constant.StringVal(tv.Value), true
}

// strs evaluates a string expression: a constant, a helper's parameter, or a sum of those.
func strs(info *types.Info, e env, x ast.Expr) ([]string, bool) {
	if v, ok := constString(info, x); ok {
		return []string{v}, true
	}
	switch x := ast.Unparen(x).(type) {
	case *ast.Ident:
		if args, ok := e[info.Uses[x]]; ok && len(args) == 1 {
			return strs(info, nil, args[0])
		}
	case *ast.BinaryExpr:
		l, ok1 := strs(info, e, x.X)
		r, ok2 := strs(info, e, x.Y)
		if ok1 && ok2 && len(l) == 1 && len(r) == 1 {
			return []string{l[0] + r[0]}, true
		}
	}
	return nil, false
}

// strList evaluates a []string: nil, a literal of constants, or a helper's variadic parameter.
func strList(info *types.Info, e env, x ast.Expr) ([]string, bool) {
	switch x := ast.Unparen(x).(type) {
	case *ast.Ident:
		if x.Name == "nil" {
			return nil, true
		}
		if args, ok := e[info.Uses[x]]; ok {
			var out []string
			for _, a := range args {
				v, ok := constString(info, a)
				if !ok {
					return nil, false
				}
				out = append(out, v)
			}
			return out, true
		}
	case *ast.CompositeLit:
		var out []string
		for _, elt := range x.Elts {
			v, ok := constString(info, elt)
			if !ok {
				return nil, false
			}
			out = append(out, v)
		}
		return out, true
	}
	return nil, false
}

// enclosingHelper is the helper (a function literal assigned to a variable) call sits in.
func enclosingHelper(helpers map[types.Object]*ast.FuncLit, call *ast.CallExpr) (types.Object, *ast.FuncLit) {
	for obj, lit := range helpers {
		if lit.Pos() <= call.Pos() && call.End() <= lit.End() {
			return obj, lit
		}
	}
	return nil, nil
}

// bind maps lit's parameters to the arguments of call.
func bind(info *types.Info, lit *ast.FuncLit, call *ast.CallExpr) env {
	e := env{}
	i := 0
	params := lit.Type.Params.List
	for pi, field := range params {
		_, variadic := field.Type.(*ast.Ellipsis)
		for _, name := range field.Names {
			obj := info.Defs[name]
			switch {
			case variadic && pi == len(params)-1:
				if i < len(call.Args) {
					e[obj] = call.Args[i:]
				} else {
					e[obj] = []ast.Expr{}
				}
			case i < len(call.Args):
				e[obj] = []ast.Expr{call.Args[i]}
			}
			i++
		}
	}
	return e
}
