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

package audit

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/tools/go/packages"
)

// Discard is one place where the code drops an error or recovers a panic: the places a failure
// could be swallowed and a request carry on somewhere it should not. The audit classifies each.
type Discard struct {
	// File is the file, relative to the module; Func the function it is in ("T.Method",
	// "Func", with "/func" for each function literal around it).
	File, Func string
	// What is the discard as the audit's table writes it, arguments elided: "_ = f()",
	// "f()" (a call statement whose error is dropped), "defer f()", "go f()", "recover()".
	What string
}

// Key is how the audit's table names the discard.
func (d Discard) Key() string { return d.File + " " + d.Func + " " + d.What }

// FindDiscards loads the packages matching patterns in the module at dir, for each of the
// given build environments ("GOOS=darwin", ...; nil for the host's), without their tests, and
// lists every discarded error and every recover, each once.
func FindDiscards(dir string, envs [][]string, patterns ...string) ([]Discard, error) {
	seen := map[string]Discard{}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if len(envs) == 0 {
		envs = [][]string{nil}
	}
	for _, env := range envs {
		cfg := &packages.Config{Dir: dir, Env: append(environ(), env...),
			Mode: packages.NeedName | packages.NeedFiles | packages.NeedSyntax | packages.NeedTypes | packages.NeedTypesInfo}
		pkgs, err := packages.Load(cfg, patterns...)
		if err != nil {
			return nil, err
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
		for _, p := range pkgs {
			for _, f := range p.Syntax {
				rel, err := filepath.Rel(dir, p.Fset.Position(f.Pos()).Filename)
				if err != nil {
					return nil, err
				}
				for _, d := range discardsIn(p.TypesInfo, f, filepath.ToSlash(rel)) {
					seen[d.Key()] = d
				}
			}
		}
	}
	out := make([]Discard, 0, len(seen))
	for _, d := range seen {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b Discard) int { return strings.Compare(a.Key(), b.Key()) })
	return out, nil
}

var errorType = types.Universe.Lookup("error").Type().Underlying().(*types.Interface)

func isError(t types.Type) bool { return t != nil && types.Implements(t, errorType) }

// discardsIn walks one file.
func discardsIn(info *types.Info, f *ast.File, file string) []Discard {
	var out []Discard
	var stack []string // the enclosing functions
	add := func(what string) {
		out = append(out, Discard{File: file, Func: strings.Join(stack, "/"), What: what})
	}
	// returnsError reports whether call's results include an error that can be other than
	// nil (writes to a hash, a strings.Builder or a bytes.Buffer are documented never to fail).
	returnsError := func(call *ast.CallExpr) bool {
		if infallible(info, call) {
			return false
		}
		switch t := info.TypeOf(call).(type) {
		case *types.Tuple:
			for i := range t.Len() {
				if isError(t.At(i).Type()) {
					return true
				}
			}
			return false
		default:
			return isError(t)
		}
	}
	var visit func(n ast.Node) bool
	visit = func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			name := n.Name.Name
			if n.Recv != nil && len(n.Recv.List) > 0 {
				name = recvName(n.Recv.List[0].Type) + "." + name
			}
			stack = append(stack, name)
			if n.Body != nil {
				ast.Inspect(n.Body, visit)
			}
			stack = stack[:len(stack)-1]
			return false
		case *ast.FuncLit:
			stack = append(stack, "func")
			ast.Inspect(n.Body, visit)
			stack = stack[:len(stack)-1]
			return false
		case *ast.AssignStmt:
			discardedAssign(info, n.Lhs, n.Rhs, add)
		case *ast.ValueSpec:
			discardedAssign(info, identsToExprs(n.Names), n.Values, add)
		case *ast.ExprStmt:
			if call, ok := ast.Unparen(n.X).(*ast.CallExpr); ok && returnsError(call) {
				add(callText(call))
			}
		case *ast.DeferStmt:
			if returnsError(n.Call) {
				add("defer " + callText(n.Call))
			}
		case *ast.GoStmt:
			if returnsError(n.Call) {
				add("go " + callText(n.Call))
			}
		case *ast.CallExpr:
			if id, ok := ast.Unparen(n.Fun).(*ast.Ident); ok && id.Name == "recover" {
				if _, builtin := info.Uses[id].(*types.Builtin); builtin {
					add("recover()")
				}
			}
		}
		return true
	}
	ast.Inspect(f, visit)
	return out
}

// infallible reports whether call writes to a hash.Hash, a *strings.Builder or a
// *bytes.Buffer (as a method, or as fmt.Fprint*'s writer), whose errors are always nil.
func infallible(info *types.Info, call *ast.CallExpr) bool {
	sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr)
	if !ok {
		return false
	}
	target := sel.X
	if pkg, ok := sel.X.(*ast.Ident); ok {
		if _, isPkg := info.Uses[pkg].(*types.PkgName); isPkg {
			if pkg.Name != "fmt" || !strings.HasPrefix(sel.Sel.Name, "Fprint") || len(call.Args) == 0 {
				return false
			}
			target = call.Args[0]
		}
	}
	t := info.TypeOf(target)
	if t == nil {
		return false
	}
	switch t.String() {
	case "*strings.Builder", "strings.Builder", "*bytes.Buffer", "bytes.Buffer", "hash.Hash", "hash.Hash32", "hash.Hash64":
		return true
	}
	return false
}

// discardedAssign reports each error assigned to the blank identifier.
func discardedAssign(info *types.Info, lhs, rhs []ast.Expr, add func(string)) {
	blank := func(e ast.Expr) bool { id, ok := e.(*ast.Ident); return ok && id.Name == "_" }
	switch {
	case len(lhs) == len(rhs):
		for i := range lhs {
			if blank(lhs[i]) && isError(info.TypeOf(rhs[i])) {
				add("_ = " + exprText(rhs[i]))
			}
		}
	case len(rhs) == 1:
		t, ok := info.TypeOf(rhs[0]).(*types.Tuple)
		if !ok {
			return
		}
		for i := range min(len(lhs), t.Len()) {
			if blank(lhs[i]) && isError(t.At(i).Type()) {
				// The left side as a pattern: "v, _ = f()" (names change, the shape does not).
				vars := make([]string, len(lhs))
				for j, e := range lhs {
					vars[j] = "v"
					if blank(e) {
						vars[j] = "_"
					}
				}
				add(strings.Join(vars, ", ") + " = " + exprText(rhs[0]))
				return
			}
		}
	}
}

func identsToExprs(ids []*ast.Ident) []ast.Expr {
	out := make([]ast.Expr, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

func recvName(t ast.Expr) string {
	switch t := t.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.IndexExpr:
		return recvName(t.X)
	case *ast.IndexListExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}

// exprText is an expression as the table writes it: a call's arguments elided.
func exprText(e ast.Expr) string {
	if call, ok := ast.Unparen(e).(*ast.CallExpr); ok {
		return callText(call)
	}
	return types.ExprString(e)
}

func callText(call *ast.CallExpr) string { return types.ExprString(shortFun(call.Fun)) + "()" }

// shortFun keeps a call's function but elides calls inside it: a.b(x).c -> a.b().c.
func shortFun(e ast.Expr) ast.Expr {
	switch e := e.(type) {
	case *ast.SelectorExpr:
		return &ast.SelectorExpr{X: shortFun(e.X), Sel: e.Sel}
	case *ast.CallExpr:
		return &ast.CallExpr{Fun: shortFun(e.Fun), Lparen: token.NoPos}
	case *ast.ParenExpr:
		return shortFun(e.X)
	}
	return e
}

func environ() []string { return os.Environ() }
