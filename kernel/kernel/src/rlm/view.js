var its=root.querySelectorAll("details.rlm-it"),box=root.querySelector(".rlm-search"),count=root.querySelector(".rlm-count");
function setAll(open){its.forEach(function(d){if(!d.classList.contains("rlm-hidden")){d.open=open;}});}
root.querySelector(".rlm-expand").addEventListener("click",function(){setAll(true);});
root.querySelector(".rlm-collapse").addEventListener("click",function(){setAll(false);});
box.addEventListener("input",function(){
  var q=box.value.trim().toLowerCase(),shown=0;
  its.forEach(function(d){
    var hit=!q||d.textContent.toLowerCase().indexOf(q)>=0;
    d.classList.toggle("rlm-hidden",!hit);
    if(hit){shown++;}
    d.open=!!q&&hit;
  });
  count.textContent=q?shown+" of "+its.length+" iterations match":"";
});
var m=/^#search=(.*)$/.exec(location.hash||"");
if(m){box.value=decodeURIComponent(m[1]);box.dispatchEvent(new Event("input"));}
