package testlane

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The import paths whose functions put a test in a lane.
const (
	testlanePath  = "github.com/redlimit/redlimit/internal/testlane"
	redistestPath = "github.com/redlimit/redlimit/internal/redistest"
)

// roots are the package-qualified functions that put a caller in a lane.
var roots = map[string]Lane{
	testlanePath + ".MarkAlone":      Alone,
	testlanePath + ".MarkServer":     Servers,
	testlanePath + ".MarkHeavy":      Heavy,
	redistestPath + ".StartCluster":  Alone,
	redistestPath + ".Start":         Servers,
	redistestPath + ".StartServer":   Servers,
	redistestPath + ".Require":       Servers,
	redistestPath + ".ServerVersion": Servers,
	redistestPath + ".NewProxy":      Servers,
}

// Classify reads the _test.go files of the package in dir and returns the
// lane of each of its tests (the functions named Test...), [CPU] for those
// that reach no mark.
//
// A test reaches a mark when its body names one of the roots (the marks,
// redistest's functions that start a server), or names a function, method
// or package-level variable of the package's test files that reaches one,
// at any depth. Names are matched without types (a method is known by its
// name alone), so a test may be put in a higher lane than it needs, never
// in a lower one, unless it reaches a server through code outside its
// package's test files other than redistest; the marks' check at run time
// catches that.
func Classify(dir string) (map[string]Lane, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return nil, err
	}
	refs, tests, err := declarations(files)
	if err != nil {
		return nil, err
	}
	lane := reach(refs)
	out := make(map[string]Lane, len(tests))
	for _, t := range tests {
		l := lane[t]
		if l == "" {
			l = CPU
		}
		out[t] = l
	}
	return out, nil
}

// Select returns the names of the tests of lanes in the lane l, sorted.
func Select(lanes map[string]Lane, l Lane) []string {
	var names []string
	for t, tl := range lanes {
		if tl == l {
			names = append(names, t)
		}
	}
	slices.Sort(names)
	return names
}

// isTest reports whether fn is a test: TestXxx(t *testing.T), not TestMain.
func isTest(fn *ast.FuncDecl) bool {
	name := fn.Name.Name
	if !strings.HasPrefix(name, "Test") || name == "TestMain" {
		return false
	}
	if r, _ := utf8.DecodeRuneInString(name[len("Test"):]); unicode.IsLower(r) {
		return false // Testify is not a test
	}
	p := fn.Type.Params.List
	if len(p) != 1 {
		return false
	}
	star, ok := p[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	sel, ok := star.X.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "T"
}

// importNames maps the names a file uses for the packages that hold roots
// to their import paths.
func importNames(file *ast.File) map[string]string {
	m := map[string]string{}
	for _, imp := range file.Imports {
		path, err := strconv.Unquote(imp.Path.Value)
		if err != nil || (path != testlanePath && path != redistestPath) {
			continue
		}
		name := path[strings.LastIndex(path, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		m[name] = path
	}
	return m
}

// names returns the names node refers to: identifiers, the selected names of
// selectors, and "path.Name" for a selector on a package of imports.
func names(node ast.Node, imports map[string]string) map[string]bool {
	out := map[string]bool{}
	ast.Inspect(node, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			if x, ok := n.X.(*ast.Ident); ok {
				if path, ok := imports[x.Name]; ok {
					out[path+"."+n.Sel.Name] = true
					return false
				}
			}
			out[n.Sel.Name] = true
		case *ast.Ident:
			out[n.Name] = true
		}
		return true
	})
	return out
}

// add merges ns into refs[name]: a name declared twice (methods of two
// types) refers to what both declarations refer to.
func add(refs map[string]map[string]bool, name string, ns map[string]bool) {
	if refs[name] == nil {
		refs[name] = map[string]bool{}
	}
	for n := range ns {
		refs[name][n] = true
	}
}

// declarations reads the test files, and returns what each declared name
// (function, method, package-level variable) refers to, and the tests.
func declarations(files []string) (map[string]map[string]bool, []string, error) {
	fset := token.NewFileSet()
	refs := map[string]map[string]bool{} // a declared name -> the names its declaration refers to
	var tests []string
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, nil, fmt.Errorf("testlane: %w", err)
		}
		imports := importNames(file)
		for _, d := range file.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Body == nil {
					continue
				}
				add(refs, d.Name.Name, names(d.Body, imports))
				if d.Recv == nil && isTest(d) {
					tests = append(tests, d.Name.Name)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if v, ok := s.(*ast.ValueSpec); ok {
						for _, n := range v.Names {
							for _, val := range v.Values {
								add(refs, n.Name, names(val, imports))
							}
						}
					}
				}
			}
		}
	}
	return refs, tests, nil
}

// reach returns the lane each declared name reaches, to a fixed point.
func reach(refs map[string]map[string]bool) map[string]Lane {
	// Tests are not followed through: one test naming another does not
	// run it.
	lane := map[string]Lane{}
	for changed := true; changed; {
		changed = false
		for name, rs := range refs {
			best := lane[name]
			for r := range rs {
				l, ok := roots[r]
				if !ok && !strings.HasPrefix(r, "Test") {
					l = lane[r]
				}
				if l.rank() > best.rank() {
					best = l
				}
			}
			if best != lane[name] {
				lane[name], changed = best, true
			}
		}
	}
	return lane
}
