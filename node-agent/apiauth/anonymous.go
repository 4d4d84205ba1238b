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

package apiauth

import (
	"context"
	"net/http"

	"k8s.io/apiserver/pkg/authentication/user"
)

// Anonymous lets every call in as system:anonymous. It is for a machine's own development
// fleet only, and an agent uses it only when told to (--auth=none): nothing falls back to it.
type Anonymous struct{}

// AuthenticateRequest authenticates every request as the anonymous user.
func (Anonymous) AuthenticateRequest(*http.Request) (user.Info, bool, string, error) {
	return &user.DefaultInfo{Name: user.Anonymous, Groups: []string{user.AllUnauthenticated}}, true, "", nil
}

// Authorize allows everything.
func (Anonymous) Authorize(context.Context, user.Info, Access) (bool, string, error) {
	return true, "", nil
}
