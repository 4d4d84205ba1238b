// Package sample emits reasons in each of the ways the finder follows, for its test.
package sample

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
)

const ReasonConst = "FromAConstant"

type verdict struct{ Reason string }

func judge(ok bool) verdict {
	if ok {
		return verdict{Reason: "FromAField"}
	}
	return verdict{Reason: ReasonConst}
}

func pair() (string, string) { return "FromATuple", "a message" }

func kindOf(n int) string {
	if n > 0 {
		return "FromAResult"
	}
	return fmt.Sprint(n)
}

func Conditions(ok bool, n int, rec events.EventRecorder, obj runtime.Object) []metav1.Condition {
	var out []metav1.Condition
	set := func(reason string) { out = append(out, metav1.Condition{Reason: reason}) }
	set("FromAHelper")
	v := judge(ok)
	set(v.Reason)
	reason, _ := pair()
	set(reason)
	var later string
	if ok {
		later = "FromAVariable"
	} else {
		later = "FromTheOtherBranch"
	}
	c := metav1.Condition{}
	c.Reason = later
	out = append(out, c)
	set(kindOf(n))
	rec.Eventf(obj, nil, "Normal", "AnEvent", "Act", "note")
	return out
}
