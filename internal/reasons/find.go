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

// Package reasons finds, in the Go source, every condition reason, event reason, fault code and
// refusal code the controller and the agents can emit, so that a document that explains them
// (docs/troubleshooting.md) is checked against the code rather than against memory.
//
// A reason is rarely a literal at the place it is written: it is a constant passed through a
// helper (`set(typ, ok, reason, message)`), a variable assigned on several branches, a field of
// an error type, or the result of a small function. The finder therefore follows a value back
// from each place one is emitted (a sink) through parameters to their call sites, variables and
// struct fields to everything assigned to them, conversions, and the return values of functions
// in the loaded packages, until it reaches constants. What it cannot follow to a constant (a
// string built at run time) it reports as a Dynamic site, by file, function and expression, so
// that a test can require each such site to be listed with the values it produces.
package reasons

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/tools/go/packages"
)

// Kind says where a value is emitted.
type Kind string

const (
	// ConditionReason is the reason of a status condition (metav1.Condition, a CSR's condition).
	ConditionReason Kind = "condition reason"
	// EventReason is the reason of an event.
	EventReason Kind = "event reason"
	// FaultCode is the code of a placement's lastFault.
	FaultCode Kind = "fault code"
	// RefusalCode is the code of an answer of the agent's HTTP API that is not a result.
	RefusalCode Kind = "refusal code"
)

// Value is one value that can be emitted, and where.
type Value struct {
	Kind  Kind
	Value string
	// At is the file (relative to the module) and line of the constant or literal.
	At string
}

// Dynamic is a sink whose value is built at run time and cannot be followed to a constant.
type Dynamic struct {
	Kind Kind
	File string
	Func string
	Expr string
}

// Key is how a test names the site: file, enclosing function and expression.
func (d Dynamic) Key() string { return d.File + " " + d.Func + " " + d.Expr }

// Result is everything Find found.
type Result struct {
	Values  []Value
	Dynamic []Dynamic
}

// Find loads the packages matching patterns in the module at dir, for each build environment
// (nil for the host's), without their tests, and returns every value their sinks can emit.
func Find(dir string, envs [][]string, patterns ...string) (*Result, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if len(envs) == 0 {
		envs = [][]string{nil}
	}
	values := map[Value]bool{}
	dynamic := map[Dynamic]bool{}
	for _, env := range envs {
		cfg := &packages.Config{Dir: dir, Env: append(os.Environ(), env...),
			Mode: packages.NeedName | packages.NeedFiles | packages.NeedSyntax | packages.NeedTypes | packages.NeedTypesInfo}
		pkgs, err := packages.Load(cfg, patterns...)
		if err != nil {
			return nil, fmt.Errorf("loading %v with %v: %w", patterns, env, err)
		}
		var errs []string
		packages.Visit(pkgs, nil, func(p *packages.Package) {
			for _, e := range p.Errors {
				errs = append(errs, e.Error())
			}
		})
		if len(errs) > 0 {
			return nil, fmt.Errorf("loading %v with %v: %s", patterns, env, strings.Join(errs, "; "))
		}
		f := newFinder(dir, pkgs)
		f.run()
		for v := range f.values {
			values[v] = true
		}
		for d := range f.dynamic {
			dynamic[d] = true
		}
	}
	r := &Result{}
	for v := range values {
		r.Values = append(r.Values, v)
	}
	for d := range dynamic {
		r.Dynamic = append(r.Dynamic, d)
	}
	slices.SortFunc(r.Values, func(a, b Value) int {
		return strings.Compare(string(a.Kind)+a.Value+a.At, string(b.Kind)+b.Value+b.At)
	})
	slices.SortFunc(r.Dynamic, func(a, b Dynamic) int { return strings.Compare(a.Key(), b.Key()) })
	return r, nil
}

// site is an expression with the package and function it sits in.
type site struct {
	pkg  *packages.Package
	file string
	fn   string
	expr ast.Expr
	// result, when above zero, makes the site result number result-1 of expr, a call with
	// several results (reason, message := progress(...)).
	result int
}

// param is the index of a parameter in the function it belongs to.
type param struct {
	fn    types.Object // the *types.Func, or the variable a function literal is assigned to
	index int
}

type finder struct {
	dir  string
	pkgs []*packages.Package

	sinks []struct {
		kind Kind
		at   site
	}
	params  map[types.Object]param      // a parameter -> its function and index
	calls   map[types.Object][]callSite // a function -> its calls
	assigns map[types.Object][]site     // a variable or field -> what is assigned to it
	returns map[result][]site           // a function's result -> what its returns give it

	values  map[Value]bool
	dynamic map[Dynamic]bool
	seen    map[seenKey]bool
}

type seenKey struct {
	pos    token.Pos
	result int
}

type result struct {
	fn    types.Object
	index int
}

type callSite struct {
	at   site
	call *ast.CallExpr
}

func newFinder(dir string, pkgs []*packages.Package) *finder {
	return &finder{dir: dir, pkgs: pkgs, params: map[types.Object]param{}, calls: map[types.Object][]callSite{},
		assigns: map[types.Object][]site{}, returns: map[result][]site{}, values: map[Value]bool{},
		dynamic: map[Dynamic]bool{}, seen: map[seenKey]bool{}}
}

func (f *finder) run() {
	for _, p := range f.pkgs {
		for _, file := range p.Syntax {
			f.index(p, file)
		}
		f.typedConstants(p)
	}
	for _, s := range f.sinks {
		f.resolve(s.kind, s.at)
	}
}

// index records, for one file, the sinks and everything resolve follows: parameters, calls,
// assignments, composite literals' fields and functions' results.
func (f *finder) index(p *packages.Package, file *ast.File) {
	rel, err := filepath.Rel(f.dir, p.Fset.Position(file.Pos()).Filename)
	if err != nil {
		rel = p.Fset.Position(file.Pos()).Filename
	}
	rel = filepath.ToSlash(rel)
	info := p.TypesInfo
	var stack []string
	var fnObjs []types.Object
	at := func(e ast.Expr) site { return site{pkg: p, file: rel, fn: strings.Join(stack, "/"), expr: e} }
	addParams := func(obj types.Object, ft *ast.FuncType) {
		i := 0
		for _, field := range ft.Params.List {
			if len(field.Names) == 0 {
				i++
				continue
			}
			for _, n := range field.Names {
				if v := info.Defs[n]; v != nil {
					f.params[v] = param{fn: obj, index: i}
				}
				i++
			}
		}
	}
	var visit func(n ast.Node) bool
	visit = func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			obj := info.Defs[n.Name]
			addParams(obj, n.Type)
			stack = append(stack, n.Name.Name)
			fnObjs = append(fnObjs, obj)
			if n.Body != nil {
				ast.Inspect(n.Body, visit)
			}
			stack, fnObjs = stack[:len(stack)-1], fnObjs[:len(fnObjs)-1]
			return false
		case *ast.AssignStmt:
			if len(n.Rhs) == 1 && len(n.Lhs) > 1 {
				for i, lhs := range n.Lhs {
					if obj := lhsObject(info, lhs); obj != nil {
						s := at(n.Rhs[0])
						s.result = i + 1
						f.assigns[obj] = append(f.assigns[obj], s)
					}
				}
				break
			}
			for i, lhs := range n.Lhs {
				if len(n.Rhs) != len(n.Lhs) {
					break
				}
				rhs := n.Rhs[i]
				obj := lhsObject(info, lhs)
				if obj == nil {
					continue
				}
				if lit, ok := rhs.(*ast.FuncLit); ok {
					addParams(obj, lit.Type)
					stack = append(stack, obj.Name())
					fnObjs = append(fnObjs, obj)
					ast.Inspect(lit.Body, visit)
					stack, fnObjs = stack[:len(stack)-1], fnObjs[:len(fnObjs)-1]
					continue
				}
				f.assigns[obj] = append(f.assigns[obj], at(rhs))
				if sel, ok := lhs.(*ast.SelectorExpr); ok {
					if k, ok := sinkField(info, sel); ok {
						f.sink(k, at(rhs)) // cond.Reason = ...
					}
				}
			}
		case *ast.ValueSpec:
			if len(n.Values) == len(n.Names) {
				for i, name := range n.Names {
					if obj := info.Defs[name]; obj != nil {
						f.assigns[obj] = append(f.assigns[obj], at(n.Values[i]))
					}
				}
			}
		case *ast.ReturnStmt:
			if len(fnObjs) > 0 {
				fn := fnObjs[len(fnObjs)-1]
				for i, r := range n.Results {
					f.returns[result{fn, i}] = append(f.returns[result{fn, i}], at(r))
				}
			}
		case *ast.CompositeLit:
			f.compositeLit(info, n, at)
		case *ast.CallExpr:
			if obj := calleeObject(info, n.Fun); obj != nil {
				f.calls[obj] = append(f.calls[obj], callSite{at: at(n), call: n})
			}
			if isEventf(info, n) && len(n.Args) > 3 {
				f.sink(EventReason, at(n.Args[3]))
			}
		}
		return true
	}
	ast.Inspect(file, visit)
}

func (f *finder) sink(k Kind, s site) {
	f.sinks = append(f.sinks, struct {
		kind Kind
		at   site
	}{k, s})
}

// sinkFields are the struct fields whose values are emitted: by the type's package path
// suffix and name (a name ending in Condition matches any condition type), and field name.
var sinkFields = []struct {
	pkgSuffix, typeName, field string
	kind                       Kind
}{
	{"k8s.io/apimachinery/pkg/apis/meta/v1", "Condition", "Reason", ConditionReason},
	{"k8s.io/api/certificates/v1", "CertificateSigningRequestCondition", "Reason", ConditionReason},
	{"/api/v1alpha1", "Fault", "Code", FaultCode},
	{"/node-agent/httpapi", "apiError", "code", RefusalCode},
	{"/node-agent/refusal", "Error", "Code", RefusalCode},
}

// sinkField reports whether sel names a sink field (c.Reason of a condition c), and its kind.
func sinkField(info *types.Info, sel *ast.SelectorExpr) (Kind, bool) {
	selection, ok := info.Selections[sel]
	if !ok || selection.Kind() != types.FieldVal {
		return "", false
	}
	t := selection.Recv()
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	named, ok := t.(*types.Named)
	if !ok || named.Obj().Pkg() == nil {
		return "", false
	}
	for _, s := range sinkFields {
		if strings.HasSuffix(named.Obj().Pkg().Path(), s.pkgSuffix) && named.Obj().Name() == s.typeName && sel.Sel.Name == s.field {
			return s.kind, true
		}
	}
	return "", false
}

// compositeLit records the values a literal gives to struct fields, and sinks among them.
func (f *finder) compositeLit(info *types.Info, n *ast.CompositeLit, at func(ast.Expr) site) {
	t := info.TypeOf(n)
	if t == nil {
		return
	}
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	named, _ := t.(*types.Named)
	st, ok := t.Underlying().(*types.Struct)
	if !ok {
		return
	}
	for i, elt := range n.Elts {
		var field *types.Var
		var value ast.Expr
		if kv, ok := elt.(*ast.KeyValueExpr); ok {
			key, ok := kv.Key.(*ast.Ident)
			if !ok {
				continue
			}
			field, _ = info.Uses[key].(*types.Var)
			value = kv.Value
		} else if i < st.NumFields() {
			field, value = st.Field(i), elt
		}
		if field == nil {
			continue
		}
		f.assigns[field] = append(f.assigns[field], at(value))
		if named == nil || named.Obj().Pkg() == nil {
			continue
		}
		for _, s := range sinkFields {
			if strings.HasSuffix(named.Obj().Pkg().Path(), s.pkgSuffix) && named.Obj().Name() == s.typeName && field.Name() == s.field {
				f.sink(s.kind, at(value))
			}
		}
	}
}

// typedConstants adds the API's documented reason constants and the refusal codes, whether or
// not a sink uses them yet: they are the API's promise of what may be written.
func (f *finder) typedConstants(p *packages.Package) {
	scope := p.Types.Scope()
	for _, name := range scope.Names() {
		c, ok := scope.Lookup(name).(*types.Const)
		if !ok || c.Val().Kind() != constant.String {
			continue
		}
		var k Kind
		switch {
		case strings.HasSuffix(p.PkgPath, "/api/v1alpha1") && strings.Contains(name, "Reason"):
			k = ConditionReason
		case strings.HasSuffix(p.PkgPath, "/node-agent/refusal") && types.TypeString(c.Type(), nil) == p.PkgPath+".Code":
			k = RefusalCode
		default:
			continue
		}
		pos := p.Fset.Position(c.Pos())
		rel, err := filepath.Rel(f.dir, pos.Filename)
		if err != nil {
			rel = pos.Filename
		}
		f.values[Value{Kind: k, Value: constant.StringVal(c.Val()), At: fmt.Sprintf("%s:%d", filepath.ToSlash(rel), pos.Line)}] = true
	}
}

// resolve follows the value of s back to constants.
func (f *finder) resolve(k Kind, s site) {
	e := ast.Unparen(s.expr)
	key := seenKey{e.Pos(), s.result}
	if f.seen[key] {
		return // a cycle: a variable assigned from itself, a recursive helper
	}
	f.seen[key] = true
	defer delete(f.seen, key)
	info := s.pkg.TypesInfo
	if s.result > 0 {
		if call, ok := e.(*ast.CallExpr); ok {
			if obj := calleeObject(info, call.Fun); obj != nil {
				for _, next := range f.returns[result{obj, s.result - 1}] {
					f.resolve(k, next)
				}
				if len(f.returns[result{obj, s.result - 1}]) > 0 {
					return
				}
			}
		}
		f.dynamic[Dynamic{Kind: k, File: s.file, Func: s.fn, Expr: fmt.Sprintf("result %d of %s", s.result, types.ExprString(e))}] = true
		return
	}
	if tv, ok := info.Types[e]; ok && tv.Value != nil && tv.Value.Kind() == constant.String {
		pos := s.pkg.Fset.Position(e.Pos())
		f.values[Value{Kind: k, Value: constant.StringVal(tv.Value), At: fmt.Sprintf("%s:%d", s.file, pos.Line)}] = true
		return
	}
	follow := func(sites []site) bool {
		for _, next := range sites {
			f.resolve(k, next)
		}
		return len(sites) > 0
	}
	switch e := e.(type) {
	case *ast.Ident, *ast.SelectorExpr:
		obj := objectOf(info, e)
		if obj == nil {
			break
		}
		if p, ok := f.params[obj]; ok {
			found := false
			for _, c := range f.calls[p.fn] {
				if p.index < len(c.call.Args) {
					found = true
					f.resolve(k, site{pkg: c.at.pkg, file: c.at.file, fn: c.at.fn, expr: c.call.Args[p.index]})
				}
			}
			if found {
				return
			}
			break
		}
		if follow(f.assigns[obj]) {
			return
		}
	case *ast.CallExpr:
		// A conversion (string(code), refusal.Code(s)) keeps the value.
		if tv, ok := info.Types[e.Fun]; ok && tv.IsType() && len(e.Args) == 1 {
			f.resolve(k, site{pkg: s.pkg, file: s.file, fn: s.fn, expr: e.Args[0]})
			return
		}
		if obj := calleeObject(info, e.Fun); obj != nil && follow(f.returns[result{obj, 0}]) {
			return
		}
	}
	f.dynamic[Dynamic{Kind: k, File: s.file, Func: s.fn, Expr: types.ExprString(e)}] = true
}

// lhsObject is the variable or field an assignment's left side names.
func lhsObject(info *types.Info, e ast.Expr) types.Object {
	switch e := e.(type) {
	case *ast.Ident:
		if obj := info.Defs[e]; obj != nil {
			return obj
		}
		return info.Uses[e]
	case *ast.SelectorExpr:
		return info.Uses[e.Sel]
	}
	return nil
}

func objectOf(info *types.Info, e ast.Expr) types.Object {
	switch e := e.(type) {
	case *ast.Ident:
		return info.Uses[e]
	case *ast.SelectorExpr:
		return info.Uses[e.Sel]
	}
	return nil
}

// calleeObject is the function, method or function-valued variable a call calls.
func calleeObject(info *types.Info, fun ast.Expr) types.Object {
	switch obj := objectOf(info, ast.Unparen(fun)).(type) {
	case *types.Func:
		return obj.Origin()
	case *types.Var:
		return obj
	}
	return nil
}

// isEventf reports whether call is Eventf of client-go's events API recorder (declared in an
// internal package that tools/events aliases), whose fourth argument is the event's reason.
func isEventf(info *types.Info, call *ast.CallExpr) bool {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Eventf" {
		return false
	}
	fn, ok := info.Uses[sel.Sel].(*types.Func)
	return ok && fn.Pkg() != nil && strings.HasPrefix(fn.Pkg().Path(), "k8s.io/client-go/") && strings.HasSuffix(fn.Pkg().Path(), "/events")
}
