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

// Package protocol carries protocol v3 between the node agent and a worker process:
// length-delimited protobuf frames (a uvarint length, then the message) on the worker's stdin
// and stdout. The messages are in workerv3, generated from workerv3/worker.proto by
// `make proto`.
//
// A frame larger than the limit, a truncated frame or bytes that are not a message are
// protocol faults, returned as typed errors, never a crash: the caller treats the stream as
// broken and recovers the worker.
package protocol
