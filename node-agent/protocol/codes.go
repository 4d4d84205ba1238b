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

package protocol

// CodeRecycle is the Error code by which a worker refuses an admission to ask for its own
// replacement: the rung needs more compiles than the process may still make (the device's
// compiler is reported to fail silently after about 119 in one process). Nothing was loaded;
// the agent requeues the admission for the replacement, which starts with no compiles made.
const CodeRecycle = "worker_recycle"

// CodeInvalidInput and CodeUnsupportedShape are the Error codes by which a worker refuses an
// Execute's input: a token id outside the model's vocabulary, a rerank sequence that is not
// query, separator, document, a sequence the rung does not take. A worker checks every
// sequence of an Execute before it runs any, so an Execute refused with either ran nothing:
// the agent may send its sequences again, apart, without replaying any inference.
const (
	CodeInvalidInput     = "invalid_input"
	CodeUnsupportedShape = "unsupported_shape"
)

// InputRefusal says whether code is a refusal of an Execute's input, made before any
// sequence ran.
func InputRefusal(code string) bool {
	return code == CodeInvalidInput || code == CodeUnsupportedShape
}
