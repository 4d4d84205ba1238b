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

package mil

import (
	"encoding/binary"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Rule names one thing Validate checks.
type Rule string

// The rules, each from what the public references report the device's compiler and runtime
// take. A rule's comment names its source.
const (
	// RuleStructure: "program(1.3)", the buildInfo block, one function main<ios18>, a return
	// (the shape of every reference program: maderix/ANE training/stories_mil.h, maderix/h3.c-ane
	// h3_ane_block.m, jundot/omlx qwen35_ane.mm).
	RuleStructure Rule = "structure"
	// RuleNames: every variable is a plain name declared once, and names its operation after
	// itself (jafreck/ironmill docs/design/ane/ane-constraints.md: duplicate variable names make
	// ANECCompile() fail).
	RuleNames Rule = "unique-names"
	// RuleReference: every argument names an input or a variable declared before it
	// (ane-constraints.md: dangling references).
	RuleReference Rule = "reference"
	// RuleOp: only operations in the forms the references run on the device (see knownOps).
	RuleOp Rule = "known-op"
	// RuleDType: data is fp16 (bool only from a comparison, into select); int32, bool and
	// string appear only as constant parameters, so there is no integer arithmetic
	// (jafreck/ironmill docs/design/ane/ane-op-support-matrix.md: "Arithmetic: only on
	// fp16/fp32 - integer arithmetic rejected"; cast to int32 rejected).
	RuleDType Rule = "dtype"
	// RuleRank: every fp16 or bool tensor is 4-D (jafreck/ironmill
	// crates/ironmill-core/src/ane/mil_text.rs: "ANE requires all tensor type declarations in
	// MIL text to be 4D"); parameter vectors are 1-D.
	RuleRank Rule = "rank"
	// RuleDims: no dimension over 16384 (jafreck/ironmill crates/ironmill-compile/src/ane/
	// validate.rs ANE_MAX_DIM, ane-constraints.md "Max tensor dimension 16,384").
	RuleDims Rule = "dimension-limit"
	// RuleShape: each declared type is what the operation gives its arguments.
	RuleShape Rule = "shape"
	// RuleLiteral: an fp16 literal is plain decimal (no reference writes exponent notation),
	// exactly an fp16 value, finite, and zero or normal (the device is reported to flush fp16
	// subnormals to zero).
	RuleLiteral Rule = "fp16-literal"
	// RuleIO: the inputs are declared in ascending name order, the order the device binds them
	// in (jafreck/ironmill crates/ironmill-compile/src/ane/passes/ane_variable_naming.rs), and
	// inputs and output are [1, C, 1, S] fp16 (the I/O layout of every reference), never with
	// C > 768 and S < 32 (ane-constraints.md: such I/O tensors are rejected).
	RuleIO Rule = "io"
	// RuleBlob: every BLOBFILE is the program's weights file and points at a MILBlob v2 record
	// of its type and size (apple/coremltools mlmodel/src/MILBlob/Blob/StorageFormat.hpp), and
	// every record is used.
	RuleBlob Rule = "blobfile"
	// RuleWorkingSet: no tensor with two inner axes over 1 (attention's heads, scores and
	// probabilities, [1, h, rows, cols], and the structural mask) holds more than
	// MaxWorkingSet bytes: the device's on-chip memory is about 32 MB (jafreck/ironmill
	// docs/design/ane/ane-constraints.md, "Stay under 32 MB working set"), and the references
	// tile attention's query rows to stay in it (maderix/h3.c-ane h3_ane_block.m
	// BLK_ATTN_TILE). Activations [1, C, 1, S] stream through the convolution engine and are
	// not counted.
	RuleWorkingSet Rule = "working-set"
)

// MaxDim is the largest dimension the device takes.
const MaxDim = 16384

// MaxWorkingSet is the most bytes one attention tensor may hold (RuleWorkingSet).
const MaxWorkingSet = 32 << 20

// ValidationError is a program that breaks a rule.
type ValidationError struct {
	Rule Rule
	// Line is the 1-based line of the text, 0 for the program as a whole.
	Line   int
	Detail string
}

func (e *ValidationError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s (line %d): %s", e.Rule, e.Line, e.Detail)
	}
	return fmt.Sprintf("%s: %s", e.Rule, e.Detail)
}

// mtype is a MIL type: a scalar (shape nil) or a tensor.
type mtype struct {
	dtype  string
	tensor bool
	shape  []int
}

func (t mtype) String() string {
	if !t.tensor {
		return t.dtype
	}
	return tensorType(t.dtype, t.shape...)
}

func (t mtype) equal(o mtype) bool {
	return t.dtype == o.dtype && t.tensor == o.tensor && slices.Equal(t.shape, o.shape)
}

// variable is a declared input, constant or operation result.
type variable struct {
	typ   mtype
	konst bool
	// ints holds an int32 constant's values; lit an fp16 or string or bool constant's text.
	ints []int
	lit  string
}

// argKind is what an operation's argument must be.
type argKind int

const (
	// data: an fp16 tensor, or an fp16 scalar constant where scalar is allowed.
	data argKind = iota
	// scalarData: an fp16 tensor or an fp16 scalar constant.
	scalarData
	// scalarConst: an fp16 scalar constant.
	scalarConst
	// boolData: a bool tensor.
	boolData
	// intsParam: a constant int32 vector; intParam a constant int32; boolParam a constant
	// bool; stringParam a constant string.
	intsParam
	intParam
	boolParam
	stringParam
	// dataTuple: a parenthesised list of fp16 tensors.
	dataTuple
)

// opSpec is one operation the device is known to take, in the form the references use.
type opSpec struct {
	args  map[string]argKind
	infer func(v func(string) variable, a map[string]string, tuple []string) (mtype, error)
}

// knownOps are the operations programs may use: each is one the references compile and run
// on the device in this form. Sources: jafreck/ironmill docs/design/ane/ane-op-support-matrix.md
// (compiled, executed and checked on the device: add, sub, mul, pow with a scalar exponent,
// abs, erf, silu, softmax, reduce_mean and reduce_max over axis 1 and -1, maximum, matmul
// with transpose flags,
// concat, tile, slice and reshape as intermediates, greater, select, rsqrt with epsilon);
// maderix/ANE training/stories_mil.h and maderix/h3.c-ane h3_ane_block.m (conv 1x1, reshape,
// transpose, slice_by_size, matmul with transpose_y, softmax, pow(x, -0.5) in working
// transformer layers).
var knownOps = map[string]opSpec{
	"conv": {args: map[string]argKind{"x": data, "weight": data, "dilations": intsParam, "groups": intParam, "pad": intsParam, "pad_type": stringParam, "strides": intsParam},
		infer: inferConv},
	"add":         {args: map[string]argKind{"x": scalarData, "y": scalarData}, infer: inferBroadcast("fp16", "x", "y")},
	"sub":         {args: map[string]argKind{"x": scalarData, "y": scalarData}, infer: inferBroadcast("fp16", "x", "y")},
	"mul":         {args: map[string]argKind{"x": scalarData, "y": scalarData}, infer: inferBroadcast("fp16", "x", "y")},
	"pow":         {args: map[string]argKind{"x": data, "y": scalarConst}, infer: inferSame},
	"rsqrt":       {args: map[string]argKind{"x": data, "epsilon": scalarConst}, infer: inferSame},
	"abs":         {args: map[string]argKind{"x": data}, infer: inferSame},
	"erf":         {args: map[string]argKind{"x": data}, infer: inferSame},
	"silu":        {args: map[string]argKind{"x": data}, infer: inferSame},
	"softmax":     {args: map[string]argKind{"x": data, "axis": intParam}, infer: inferSame},
	"reduce_mean": {args: map[string]argKind{"x": data, "axes": intsParam, "keep_dims": boolParam}, infer: inferReduce},
	"reduce_max":  {args: map[string]argKind{"x": data, "axes": intsParam, "keep_dims": boolParam}, infer: inferReduce},
	"maximum":     {args: map[string]argKind{"x": scalarData, "y": scalarData}, infer: inferBroadcast("fp16", "x", "y")},
	"matmul":      {args: map[string]argKind{"x": data, "y": data, "transpose_x": boolParam, "transpose_y": boolParam}, infer: inferMatmul},
	"reshape":     {args: map[string]argKind{"x": data, "shape": intsParam}, infer: inferReshape},
	"transpose":   {args: map[string]argKind{"x": data, "perm": intsParam}, infer: inferTranspose},
	"slice_by_size": {args: map[string]argKind{"x": data, "begin": intsParam, "size": intsParam},
		infer: inferSlice},
	"concat":  {args: map[string]argKind{"values": dataTuple, "axis": intParam, "interleave": boolParam}, infer: inferConcat},
	"tile":    {args: map[string]argKind{"x": data, "reps": intsParam}, infer: inferTile},
	"greater": {args: map[string]argKind{"x": scalarData, "y": scalarData}, infer: inferBroadcast("bool", "x", "y")},
	"select":  {args: map[string]argKind{"cond": boolData, "a": scalarData, "b": scalarData}, infer: inferBroadcast("fp16", "cond", "a", "b")},
}

// refusedOps say why an operation a MIL writer might reach for is not used.
var refusedOps = map[string]string{
	"gelu":       "no reference runs gelu on the device; compose it from erf (jafreck/ironmill ane-op-support-matrix.md)",
	"layer_norm": "verified on the device only over the last axis and without gamma (jafreck/ironmill ane-op-support-matrix.md); compose it",
	"range_1d":   "integer arithmetic does not run on the device (jafreck/ironmill ane-op-support-matrix.md)",
	"cast":       "casts to int32 are rejected by the device (jafreck/ironmill ane-op-support-matrix.md)",
	"gather":     "runtime gather is rejected by the device (jafreck/ironmill ane-op-support-matrix.md)",
	"neg":        "neg is rejected by the device; multiply by -1 (jafreck/ironmill ane-op-support-matrix.md)",
	"sin":        "sin is rejected by the device (jafreck/ironmill ane-op-support-matrix.md)",
	"cos":        "cos is rejected by the device (jafreck/ironmill ane-op-support-matrix.md)",
}

var (
	funcLine   = regexp.MustCompile(`^    func main<ios18>\((.*)\) \{$`)
	returnLine = regexp.MustCompile(`^    \} -> \(([A-Za-z_][A-Za-z0-9_]*)\);$`)
	plainFP16  = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?$`)
	blobValue  = regexp.MustCompile(`^BLOBFILE\(path = string\("([^"]*)"\), offset = uint64\(([0-9]+)\)\)$`)
)

// Validate checks a program against every rule before it is written or compiled, returning
// the first *ValidationError.
func Validate(p Program) error {
	v := &validator{p: p, vars: map[string]variable{}, opNames: map[string]bool{}, records: map[uint64]bool{}}
	return v.run()
}

type validator struct {
	p       Program
	vars    map[string]variable
	opNames map[string]bool
	records map[uint64]bool
	line    int
}

func (v *validator) fail(rule Rule, format string, args ...any) error {
	return &ValidationError{Rule: rule, Line: v.line, Detail: fmt.Sprintf(format, args...)}
}

func (v *validator) run() error {
	lines := strings.Split(strings.TrimSuffix(v.p.Text, "\n"), "\n")
	v.line = 1
	if len(lines) < 5 || lines[0] != "program(1.3)" {
		return v.fail(RuleStructure, "the program must start with program(1.3)")
	}
	v.line = 2
	if lines[1] != buildInfo {
		return v.fail(RuleStructure, "the buildInfo block must follow the version line")
	}
	v.line = 3
	if lines[2] != "{" {
		return v.fail(RuleStructure, "want {")
	}
	v.line = 4
	m := funcLine.FindStringSubmatch(lines[3])
	if m == nil {
		return v.fail(RuleStructure, "want one function main<ios18>")
	}
	if err := v.inputs(m[1]); err != nil {
		return err
	}
	last := len(lines) - 1
	v.line = last + 1
	if lines[last] != "}" {
		return v.fail(RuleStructure, "the program must end with }")
	}
	for i := 4; i < last-1; i++ {
		v.line = i + 1
		if err := v.statement(strings.TrimPrefix(lines[i], "        ")); err != nil {
			return err
		}
	}
	v.line = last
	r := returnLine.FindStringSubmatch(lines[last-1])
	if r == nil {
		return v.fail(RuleStructure, "want } -> (name);")
	}
	out, ok := v.vars[r[1]]
	if !ok {
		return v.fail(RuleReference, "the program returns %s, which it never declares", r[1])
	}
	if err := v.ioType(r[1], out.typ); err != nil {
		return err
	}
	v.line = 0
	return v.blobUsed()
}

// inputs checks the function's parameters.
func (v *validator) inputs(params string) error {
	var names []string
	rest := params
	for rest != "" {
		typ, after, err := parseType(rest)
		if err != nil {
			return v.fail(RuleStructure, "input %d: %v", len(names)+1, err)
		}
		name, tail, _ := strings.Cut(strings.TrimPrefix(after, " "), ", ")
		if !plainName.MatchString(name) {
			return v.fail(RuleNames, "input name %q is not plain", name)
		}
		if _, dup := v.vars[name]; dup {
			return v.fail(RuleNames, "input %s is declared twice", name)
		}
		if err := v.ioType(name, typ); err != nil {
			return err
		}
		v.vars[name] = variable{typ: typ}
		names = append(names, name)
		rest = tail
	}
	if len(names) == 0 {
		return v.fail(RuleIO, "the function takes no input")
	}
	if !slices.IsSorted(names) {
		return v.fail(RuleIO, "inputs %v are not in ascending name order, the order the device binds them in", names)
	}
	if len(v.p.Inputs) > 0 {
		declared := make([]string, len(v.p.Inputs))
		for i, in := range v.p.Inputs {
			declared[i] = in.Name
		}
		if !slices.Equal(declared, names) {
			return v.fail(RuleIO, "the program says its inputs are %v, the text declares %v", declared, names)
		}
	}
	return nil
}

// ioType checks an input's or the output's type: [1, C, 1, S] fp16.
func (v *validator) ioType(name string, t mtype) error {
	if !t.tensor || t.dtype != "fp16" || len(t.shape) != 4 || t.shape[0] != 1 || t.shape[2] != 1 {
		return v.fail(RuleIO, "%s is %s; inputs and outputs are tensor<fp16, [1, C, 1, S]>", name, t)
	}
	if err := v.dims(name, t); err != nil {
		return err
	}
	if t.shape[1] > 768 && t.shape[3] < 32 {
		return v.fail(RuleIO, "%s is %s: the device rejects I/O tensors of more than 768 channels over fewer than 32 positions", name, t)
	}
	return nil
}

func (v *validator) dims(name string, t mtype) error {
	switch {
	case !t.tensor:
		return nil
	case t.dtype == "int32":
		if len(t.shape) != 1 {
			return v.fail(RuleRank, "%s is %s; int32 tensors are parameter vectors", name, t)
		}
	case len(t.shape) != 4:
		return v.fail(RuleRank, "%s is %s; the device's tensors are 4-D", name, t)
	}
	for _, d := range t.shape {
		if d < 1 || d > MaxDim {
			return v.fail(RuleDims, "%s is %s; every dimension must be 1 to %d", name, t, MaxDim)
		}
	}
	return nil
}

// statement checks one line of the function's body.
func (v *validator) statement(line string) error {
	typ, rest, err := parseType(line)
	if err != nil {
		return v.fail(RuleStructure, "%v", err)
	}
	name, rest, ok := strings.Cut(strings.TrimPrefix(rest, " "), " = ")
	if !ok || !plainName.MatchString(name) {
		return v.fail(RuleNames, "variable name %q is not plain", name)
	}
	if _, dup := v.vars[name]; dup {
		return v.fail(RuleNames, "%s is declared twice", name)
	}
	opName, rest, ok := strings.Cut(rest, "(")
	if !ok {
		return v.fail(RuleStructure, "want an operation call")
	}
	args, rest, err := balanced(rest)
	if err != nil {
		return v.fail(RuleStructure, "%s: %v", name, err)
	}
	label := `[name = string("` + name + `")`
	if !strings.HasPrefix(rest, label) || !strings.HasSuffix(rest, "];") {
		return v.fail(RuleNames, "%s must name its operation %q", name, name)
	}
	if v.opNames[name] {
		return v.fail(RuleNames, "operation %s is named twice", name)
	}
	v.opNames[name] = true
	tail := strings.TrimSuffix(strings.TrimPrefix(rest, label), "];")
	if err := v.dims(name, typ); err != nil {
		return err
	}
	if opName == "const" {
		if args != "" || !strings.HasPrefix(tail, ", val = ") {
			return v.fail(RuleStructure, "constant %s must be const()[name = ..., val = ...]", name)
		}
		return v.konst(name, typ, strings.TrimPrefix(tail, ", val = "))
	}
	if tail != "" {
		return v.fail(RuleStructure, "%s: unexpected %q", name, tail)
	}
	return v.operation(name, typ, opName, args)
}

// konst checks a constant's value against its declared type.
func (v *validator) konst(name string, typ mtype, val string) error {
	vr := variable{typ: typ, konst: true}
	switch {
	case !typ.tensor && typ.dtype == "fp16":
		lit, ok := strings.CutPrefix(val, "fp16(")
		if !ok || !strings.HasSuffix(lit, ")") {
			return v.fail(RuleDType, "%s is fp16 but its value is %s", name, val)
		}
		lit = strings.TrimSuffix(lit, ")")
		if err := v.literal(name, lit); err != nil {
			return err
		}
		vr.lit = lit
	case !typ.tensor && typ.dtype == "int32":
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(val, "int32("), ")"))
		if err != nil || !strings.HasPrefix(val, "int32(") {
			return v.fail(RuleDType, "%s is int32 but its value is %s", name, val)
		}
		vr.ints = []int{n}
	case !typ.tensor && typ.dtype == "bool":
		if val != "bool(true)" && val != "bool(false)" {
			return v.fail(RuleDType, "%s is bool but its value is %s", name, val)
		}
		vr.lit = val
	case !typ.tensor && typ.dtype == "string":
		s, ok := strings.CutPrefix(val, `string("`)
		if !ok || !strings.HasSuffix(s, `")`) {
			return v.fail(RuleDType, "%s is string but its value is %s", name, val)
		}
		vr.lit = strings.TrimSuffix(s, `")`)
	case typ.tensor && typ.dtype == "int32":
		body, ok := strings.CutPrefix(val, typ.String()+"([")
		if !ok || !strings.HasSuffix(body, "])") {
			return v.fail(RuleDType, "%s is %s but its value is %s", name, typ, val)
		}
		for _, f := range strings.Split(strings.TrimSuffix(body, "])"), ", ") {
			n, err := strconv.Atoi(f)
			if err != nil {
				return v.fail(RuleDType, "%s: %q is not an int32", name, f)
			}
			vr.ints = append(vr.ints, n)
		}
		if len(vr.ints) != typ.shape[0] {
			return v.fail(RuleShape, "%s is %s but holds %d values", name, typ, len(vr.ints))
		}
	case typ.tensor && typ.dtype == "fp16":
		inner, ok := strings.CutPrefix(val, typ.String()+"(")
		if !ok || !strings.HasSuffix(inner, ")") {
			return v.fail(RuleBlob, "%s is %s; an fp16 tensor constant is a BLOBFILE of that type", name, typ)
		}
		if err := v.blobfile(name, typ, strings.TrimSuffix(inner, ")")); err != nil {
			return err
		}
	default:
		return v.fail(RuleDType, "%s: a constant of type %s is not one the programs use", name, typ)
	}
	v.vars[name] = vr
	return nil
}

// literal checks an fp16 literal.
func (v *validator) literal(name, lit string) error {
	if !plainFP16.MatchString(lit) {
		return v.fail(RuleLiteral, "%s = fp16(%s): write fp16 literals in plain decimal", name, lit)
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil {
		return v.fail(RuleLiteral, "%s = fp16(%s): %v", name, lit, err)
	}
	switch a := math.Abs(f); {
	case a > 65504:
		return v.fail(RuleLiteral, "%s = fp16(%s) is beyond fp16's range", name, lit)
	case float64(fp16(float32(f))) != f:
		return v.fail(RuleLiteral, "%s = fp16(%s) is not an fp16 value (it reads as %v)", name, lit, fp16(float32(f)))
	case a != 0 && a < MinNormalFP16:
		return v.fail(RuleLiteral, "%s = fp16(%s) is an fp16 subnormal, which the device flushes to zero", name, lit)
	}
	return nil
}

// blobfile checks a BLOBFILE value against the program's weights.
func (v *validator) blobfile(name string, typ mtype, val string) error {
	m := blobValue.FindStringSubmatch(val)
	if m == nil {
		return v.fail(RuleBlob, "%s: %q is not BLOBFILE(path = string(...), offset = uint64(...))", name, val)
	}
	if m[1] != BlobPath {
		return v.fail(RuleBlob, "%s reads %s; the program's weights are %s", name, m[1], BlobPath)
	}
	off, err := strconv.ParseUint(m[2], 10, 64)
	if err != nil {
		return v.fail(RuleBlob, "%s: offset %s", name, m[2])
	}
	w := v.p.Weights
	if len(w) < blobAlign || binary.LittleEndian.Uint32(w[4:]) != blobVersion {
		return v.fail(RuleBlob, "the weights are not a MILBlob v2 file")
	}
	if off%blobAlign != 0 || off < blobAlign || off+blobAlign > uint64(len(w)) {
		return v.fail(RuleBlob, "%s: offset %d is not a record of a %d-byte weights file", name, off, len(w))
	}
	rec := w[off:]
	size, at := binary.LittleEndian.Uint64(rec[8:]), binary.LittleEndian.Uint64(rec[16:])
	want := uint64(2)
	for _, d := range typ.shape {
		want *= uint64(d)
	}
	switch {
	case binary.LittleEndian.Uint32(rec) != blobSentinel:
		return v.fail(RuleBlob, "%s: no record sentinel at offset %d", name, off)
	case binary.LittleEndian.Uint32(rec[4:]) != DTypeFP16:
		return v.fail(RuleBlob, "%s: the record at %d is not fp16", name, off)
	case size != want:
		return v.fail(RuleBlob, "%s is %s (%d bytes) but its record holds %d", name, typ, want, size)
	case at%blobAlign != 0 || at < off+blobAlign || at+size > uint64(len(w)):
		return v.fail(RuleBlob, "%s: the record's data at %d is outside the file or unaligned", name, at)
	case v.records[off]:
		return v.fail(RuleBlob, "%s: the record at %d is used twice", name, off)
	}
	v.records[off] = true
	return nil
}

// blobUsed checks that every record of the weights is some constant's.
func (v *validator) blobUsed() error {
	w := v.p.Weights
	if len(w) < blobAlign {
		return v.fail(RuleBlob, "the weights are not a MILBlob v2 file")
	}
	if n := binary.LittleEndian.Uint32(w); int(n) != len(v.records) {
		return v.fail(RuleBlob, "the weights hold %d records and the program uses %d", n, len(v.records))
	}
	return nil
}

// operation checks one operation's arguments, types and result.
func (v *validator) operation(name string, typ mtype, opName, argText string) error {
	spec, ok := knownOps[opName]
	if !ok {
		if why, refused := refusedOps[opName]; refused {
			return v.fail(RuleOp, "%s: %s: %s", name, opName, why)
		}
		return v.fail(RuleOp, "%s: %s is not an operation the device is known to take", name, opName)
	}
	args := map[string]string{}
	var tuple []string
	for _, kv := range splitTop(argText) {
		k, val, ok := strings.Cut(kv, " = ")
		if !ok {
			return v.fail(RuleStructure, "%s: argument %q", name, kv)
		}
		if _, dup := args[k]; dup {
			return v.fail(RuleStructure, "%s: argument %s given twice", name, k)
		}
		kind, ok := spec.args[k]
		if !ok {
			return v.fail(RuleOp, "%s: %s takes no argument %s", name, opName, k)
		}
		if kind == dataTuple {
			inner, ok := strings.CutPrefix(val, "(")
			if !ok || !strings.HasSuffix(inner, ")") {
				return v.fail(RuleStructure, "%s: %s must be a list", name, k)
			}
			tuple = strings.Split(strings.TrimSuffix(inner, ")"), ", ")
			for _, t := range tuple {
				if err := v.arg(name, k, t, data); err != nil {
					return err
				}
			}
		} else if err := v.arg(name, k, val, kind); err != nil {
			return err
		}
		args[k] = val
	}
	for k := range spec.args {
		if _, ok := args[k]; !ok {
			return v.fail(RuleOp, "%s: %s needs its %s argument", name, opName, k)
		}
	}
	get := func(n string) variable { return v.vars[n] }
	want, err := spec.infer(get, args, tuple)
	if err != nil {
		return v.fail(RuleShape, "%s: %s: %v", name, opName, err)
	}
	if !typ.equal(want) {
		rule := RuleShape
		if typ.dtype != want.dtype {
			rule = RuleDType
		}
		return v.fail(rule, "%s is declared %s but %s gives %s", name, typ, opName, want)
	}
	if len(typ.shape) == 4 && typ.shape[2] > 1 && typ.shape[3] > 1 {
		if bytes := product(typ.shape) * dtypeBytes(typ.dtype); bytes > MaxWorkingSet {
			return v.fail(RuleWorkingSet, "%s is %s, %d MiB; one attention tensor may hold at most %d MiB (tile the query rows)", name, typ, bytes>>20, MaxWorkingSet>>20)
		}
	}
	v.vars[name] = variable{typ: typ}
	return nil
}

// dtypeBytes is the size of one element (a bool as a byte).
func dtypeBytes(dtype string) int {
	if dtype == "fp16" {
		return 2
	}
	return 1
}

// arg checks one argument against what the operation takes there.
func (v *validator) arg(op, key, ref string, kind argKind) error {
	a, ok := v.vars[ref]
	if !ok {
		return v.fail(RuleReference, "%s: %s = %s names nothing declared before it", op, key, ref)
	}
	t := a.typ
	okay := false
	switch kind {
	case data:
		okay = t.tensor && t.dtype == "fp16"
	case scalarData:
		okay = t.dtype == "fp16" && (t.tensor || a.konst)
	case scalarConst:
		okay = !t.tensor && t.dtype == "fp16" && a.konst
	case boolData:
		okay = t.tensor && t.dtype == "bool"
	case intsParam:
		okay = t.tensor && t.dtype == "int32" && a.konst
	case intParam:
		okay = !t.tensor && t.dtype == "int32" && a.konst
	case boolParam:
		okay = !t.tensor && t.dtype == "bool" && a.konst
	case stringParam:
		okay = !t.tensor && t.dtype == "string" && a.konst
	}
	if !okay {
		return v.fail(RuleDType, "%s: %s = %s is %s, not what the operation takes there", op, key, ref, t)
	}
	return nil
}

// parseType reads a type at the start of s.
func parseType(s string) (mtype, string, error) {
	for _, scalar := range []string{"fp16", "int32", "bool", "string"} {
		if rest, ok := strings.CutPrefix(s, scalar+" "); ok {
			return mtype{dtype: scalar}, " " + rest, nil
		}
	}
	rest, ok := strings.CutPrefix(s, "tensor<")
	if !ok {
		return mtype{}, "", fmt.Errorf("%q does not start with a type", s)
	}
	dtype, rest, ok := strings.Cut(rest, ", [")
	if !ok {
		return mtype{}, "", fmt.Errorf("%q is not a tensor type", s)
	}
	dims, rest, ok := strings.Cut(rest, "]>")
	if !ok {
		return mtype{}, "", fmt.Errorf("%q is not a tensor type", s)
	}
	t := mtype{dtype: dtype, tensor: true}
	for _, f := range strings.Split(dims, ", ") {
		n, err := strconv.Atoi(f)
		if err != nil {
			return mtype{}, "", fmt.Errorf("dimension %q of %q", f, s)
		}
		t.shape = append(t.shape, n)
	}
	switch dtype {
	case "fp16", "int32", "bool":
	default:
		return mtype{}, "", fmt.Errorf("%s tensors are not ones the programs use", dtype)
	}
	return t, rest, nil
}

// balanced splits "args) rest" at the parenthesis that closes the call.
func balanced(s string) (string, string, error) {
	depth := 1
	for i, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return s[:i], s[i+1:], nil
			}
		}
	}
	return "", "", fmt.Errorf("unbalanced parentheses")
}

// splitTop splits arguments at the commas outside parentheses.
func splitTop(s string) []string {
	if s == "" {
		return nil
	}
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return append(out, strings.TrimSpace(s[start:]))
}

// The shape rules.

func tensorOf(dtype string, shape []int) mtype {
	return mtype{dtype: dtype, tensor: true, shape: shape}
}

func inferSame(v func(string) variable, a map[string]string, _ []string) (mtype, error) {
	return v(a["x"]).typ, nil
}

// inferBroadcast is numpy broadcasting over 4-D tensors and scalars.
func inferBroadcast(dtype string, keys ...string) func(v func(string) variable, a map[string]string, _ []string) (mtype, error) {
	return func(v func(string) variable, a map[string]string, _ []string) (mtype, error) {
		var shape []int
		for _, k := range keys {
			t := v(a[k]).typ
			if !t.tensor {
				continue
			}
			if shape == nil {
				shape = slices.Clone(t.shape)
				continue
			}
			for i, d := range t.shape {
				switch {
				case d == shape[i] || d == 1:
				case shape[i] == 1:
					shape[i] = d
				default:
					return mtype{}, fmt.Errorf("%v and %v do not broadcast", shape, t.shape)
				}
			}
		}
		if shape == nil {
			return mtype{}, fmt.Errorf("no tensor argument")
		}
		return tensorOf(dtype, shape), nil
	}
}

func inferConv(v func(string) variable, a map[string]string, _ []string) (mtype, error) {
	x, w := v(a["x"]).typ.shape, v(a["weight"]).typ.shape
	switch {
	case !v(a["weight"]).konst:
		return mtype{}, fmt.Errorf("the weight must be a constant")
	case w[1] != x[1] || w[2] != 1 || w[3] != 1:
		return mtype{}, fmt.Errorf("a %v weight over a %v input is not a 1x1 convolution", w, x)
	case !slices.Equal(v(a["strides"]).ints, []int{1, 1}) || !slices.Equal(v(a["dilations"]).ints, []int{1, 1}) ||
		!slices.Equal(v(a["pad"]).ints, []int{0, 0, 0, 0}) || !slices.Equal(v(a["groups"]).ints, []int{1}) || v(a["pad_type"]).lit != "valid":
		return mtype{}, fmt.Errorf("only the 1x1 form the references use (valid, strides 1, no padding, one group)")
	}
	return tensorOf("fp16", []int{x[0], w[0], x[2], x[3]}), nil
}

func inferReduce(v func(string) variable, a map[string]string, _ []string) (mtype, error) {
	if v(a["keep_dims"]).lit != "bool(true)" {
		return mtype{}, fmt.Errorf("keep_dims must be true, so every tensor stays 4-D")
	}
	shape := slices.Clone(v(a["x"]).typ.shape)
	for _, ax := range v(a["axes"]).ints {
		if ax < 0 {
			ax += len(shape)
		}
		if ax < 0 || ax >= len(shape) {
			return mtype{}, fmt.Errorf("axis %d of a %d-D tensor", ax, len(shape))
		}
		shape[ax] = 1
	}
	return tensorOf("fp16", shape), nil
}

func inferMatmul(v func(string) variable, a map[string]string, _ []string) (mtype, error) {
	x, y := slices.Clone(v(a["x"]).typ.shape), slices.Clone(v(a["y"]).typ.shape)
	if v(a["transpose_x"]).lit == "bool(true)" {
		x[2], x[3] = x[3], x[2]
	}
	if v(a["transpose_y"]).lit == "bool(true)" {
		y[2], y[3] = y[3], y[2]
	}
	if x[0] != y[0] || x[1] != y[1] || x[3] != y[2] {
		return mtype{}, fmt.Errorf("%v times %v", x, y)
	}
	return tensorOf("fp16", []int{x[0], x[1], x[2], y[3]}), nil
}

func product(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

func inferReshape(v func(string) variable, a map[string]string, _ []string) (mtype, error) {
	x, shape := v(a["x"]).typ.shape, v(a["shape"]).ints
	if product(x) != product(shape) || slices.ContainsFunc(shape, func(d int) bool { return d < 1 }) {
		return mtype{}, fmt.Errorf("%v cannot become %v", x, shape)
	}
	return tensorOf("fp16", slices.Clone(shape)), nil
}

func inferTranspose(v func(string) variable, a map[string]string, _ []string) (mtype, error) {
	x, perm := v(a["x"]).typ.shape, v(a["perm"]).ints
	sorted := slices.Sorted(slices.Values(perm))
	if !slices.Equal(sorted, []int{0, 1, 2, 3}) {
		return mtype{}, fmt.Errorf("perm %v is not a permutation of four axes", perm)
	}
	out := make([]int, 4)
	for i, p := range perm {
		out[i] = x[p]
	}
	return tensorOf("fp16", out), nil
}

func inferSlice(v func(string) variable, a map[string]string, _ []string) (mtype, error) {
	x, begin, size := v(a["x"]).typ.shape, v(a["begin"]).ints, v(a["size"]).ints
	if len(begin) != 4 || len(size) != 4 {
		return mtype{}, fmt.Errorf("begin and size need four values")
	}
	for i := range 4 {
		if begin[i] < 0 || size[i] < 1 || begin[i]+size[i] > x[i] {
			return mtype{}, fmt.Errorf("begin %v size %v outside %v", begin, size, x)
		}
	}
	return tensorOf("fp16", slices.Clone(size)), nil
}

func inferConcat(v func(string) variable, a map[string]string, tuple []string) (mtype, error) {
	if v(a["interleave"]).lit != "bool(false)" {
		return mtype{}, fmt.Errorf("interleave must be false")
	}
	axis := v(a["axis"]).ints[0]
	if axis < 0 {
		axis += 4
	}
	if axis < 0 || axis > 3 || len(tuple) == 0 {
		return mtype{}, fmt.Errorf("axis %d over %d values", axis, len(tuple))
	}
	out := slices.Clone(v(tuple[0]).typ.shape)
	out[axis] = 0
	for _, t := range tuple {
		s := v(t).typ.shape
		for i := range 4 {
			if i != axis && s[i] != out[i] {
				return mtype{}, fmt.Errorf("%v does not join %v along axis %d", s, out, axis)
			}
		}
		out[axis] += s[axis]
	}
	return tensorOf("fp16", out), nil
}

func inferTile(v func(string) variable, a map[string]string, _ []string) (mtype, error) {
	x, reps := v(a["x"]).typ.shape, v(a["reps"]).ints
	if len(reps) != 4 {
		return mtype{}, fmt.Errorf("reps need four values")
	}
	out := make([]int, 4)
	for i := range 4 {
		if reps[i] < 1 {
			return mtype{}, fmt.Errorf("reps %v", reps)
		}
		out[i] = x[i] * reps[i]
	}
	return tensorOf("fp16", out), nil
}
